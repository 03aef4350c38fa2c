/* grpc_infer_inputs: see grpc_infer_inputs.h. Protobuf's wire format: each field a varint tag (number << 3 | wire
 * type), then a varint (0), 8 bytes (1), a varint length and that many bytes (2) or 4 bytes (5). */
#include <string.h>

#include "grpc_infer_inputs.h"

/* A varint at *at (before end): 1 and its value, or 0 where it does not end within the bytes (or runs past 10). */
static int varint(const uint8_t **at, const uint8_t *end, uint64_t *value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && *at < end; shift += 7) {
        uint8_t byte = *(*at)++;
        v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *value = v;
            return 1;
        }
    }
    return 0;
}

/* One field at *at: its number, wire type and, for type 2, its bytes; 0 where it is not whole within the bytes. */
static int field(const uint8_t **at, const uint8_t *end, uint32_t *number, uint32_t *type, const uint8_t **bytes,
                 size_t *len) {
    uint64_t tag, v;
    if (!varint(at, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) return 0;
    *number = (uint32_t)(tag >> 3), *type = (uint32_t)(tag & 7);
    switch (*type) {
    case 0: return varint(at, end, &v);
    case 1: if (end - *at < 8) return 0; *at += 8; return 1;
    case 5: if (end - *at < 4) return 0; *at += 4; return 1;
    case 2:
        if (!varint(at, end, &v) || v > (uint64_t)(end - *at)) return 0;
        *bytes = *at, *len = (size_t)v, *at += v;
        return 1;
    default: return 0; /* groups, or not protobuf */
    }
}

/* An InferInputTensor (name 1, datatype 2, shape 3: packed or not): 0 where it cannot be read. */
static int tensor(const uint8_t *at, const uint8_t *end, struct infer_input *in) {
    in->name = in->datatype = NULL, in->name_len = in->datatype_len = 0, in->rank = 0; /* the shape: as far as rank */
    while (at < end) {
        uint32_t number, type;
        const uint8_t *bytes = NULL;
        size_t len = 0;
        const uint8_t *before = at;
        if (!field(&at, end, &number, &type, &bytes, &len)) return 0;
        if (number == 1 && type == 2) in->name = bytes, in->name_len = len;
        else if (number == 2 && type == 2) in->datatype = bytes, in->datatype_len = len;
        else if (number == 3 && type == 2) {
            for (const uint8_t *p = bytes, *stop = bytes + len; p < stop;) {
                uint64_t v;
                if (!varint(&p, stop, &v)) return 0;
                if (in->rank < INFER_MAX_RANK) in->shape[in->rank] = (int64_t)v;
                if (in->rank < INFER_MAX_RANK) in->rank++;
            }
        } else if (number == 3 && type == 0) {
            const uint8_t *p = before;
            uint64_t tag, v;
            varint(&p, end, &tag);
            if (!varint(&p, end, &v)) return 0;
            if (in->rank < INFER_MAX_RANK) in->shape[in->rank++] = (int64_t)v;
        } else if (number <= 3) {
            return 0; /* a known field of another wire type: not what tritonserver would read */
        }
    }
    return in->name != NULL && in->datatype != NULL;
}

/* The model's name: the first model_name field within the bytes, before any field past the inputs. */
static void model_name(const uint8_t *bytes, size_t n, const uint8_t **model, size_t *model_len) {
    *model = NULL, *model_len = 0;
    for (const uint8_t *at = bytes, *end = bytes + n; at < end;) {
        uint32_t number, type;
        const uint8_t *value = NULL;
        size_t len = 0;
        if (!field(&at, end, &number, &type, &value, &len) || number >= 6) return;
        if (number == 1 && type == 2) *model = value, *model_len = len;
    }
}

int infer_inputs_each(const uint8_t *bytes, size_t n, infer_input_fn fn, void *context) {
    const uint8_t *model;
    size_t model_len;
    model_name(bytes, n, &model, &model_len);
    if (model == NULL) return 0;
    struct infer_input one; /* one at a time: about 1 KiB of stack, not INFER_MAX_INPUTS of them */
    int read = 0;
    for (const uint8_t *at = bytes, *end = bytes + n; at < end && read < INFER_MAX_INPUTS;) {
        uint32_t number, type;
        const uint8_t *value = NULL;
        size_t len = 0;
        if (!field(&at, end, &number, &type, &value, &len)) return 0; /* the rest is not within the bytes */
        if (number == 5 && type == 2 && tensor(value, value + len, &one)) {
            read++;
            int said = fn(context, model, model_len, &one);
            if (said) return said;
        }
        if (number >= 6) return 0; /* outputs, then the raw contents: no input follows in the order protobuf writes */
    }
    return 0;
}

static int collect(void *context, const uint8_t *model, size_t model_len, const struct infer_input *in) {
    struct infer_lead *out = context;
    out->model = model, out->model_len = model_len;
    out->inputs[out->count++] = *in;
    return 0;
}

void infer_lead_read(const uint8_t *bytes, size_t n, struct infer_lead *out) {
    out->count = 0; /* the inputs: as far as count (every call: no 17 KB memset) */
    model_name(bytes, n, &out->model, &out->model_len);
    if (out->model != NULL) infer_inputs_each(bytes, n, collect, out);
}
