/* grpc_infer_inputs: the input tensors a gRPC ModelInferRequest names, read from the first bytes of its message (the
 * guard reads them before gRPC holds the message: h2_admission.c), so that a wrong datatype, shape or batch is refused
 * before tritonserver in the words an HTTP request gets (http_checks.c: check_input_tensor). */
#ifndef GRPC_INFER_INPUTS_H
#define GRPC_INFER_INPUTS_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

#define INFER_MAX_INPUTS 16
#define INFER_MAX_RANK 129 /* one past the checks' 128: "more than 128 dimensions" */
#define INFER_LEAD 4096    /* the message's first bytes read */

struct infer_input {
    const uint8_t *name, *datatype;
    size_t name_len, datatype_len;
    int64_t shape[INFER_MAX_RANK];
    int rank;
};

struct infer_lead {
    const uint8_t *model; /* NULL: no model_name within the bytes */
    size_t model_len;
    int count; /* the inputs whose message is whole within the bytes (at most INFER_MAX_INPUTS) */
    struct infer_input inputs[INFER_MAX_INPUTS];
};

/* What n bytes from a message's start hold whole: the model's name and each input whose InferInputTensor is whole
 * (inference.ModelInferRequest: model_name 1, inputs 5). Bytes that are not the start of one read as holding less
 * (nothing is refused for what was not read). */
void infer_lead_read(const uint8_t *bytes, size_t n, struct infer_lead *out);

/* The same reading one input at a time, for a check that stops at the first fault (the guard's: h2_admission.c): fn
 * is called for each input infer_lead_read would hold, in order, with the model's name, until it returns non-zero,
 * which is returned (0: every input was seen, or no model's name is within the bytes). */
typedef int (*infer_input_fn)(void *context, const uint8_t *model, size_t model_len, const struct infer_input *in);
int infer_inputs_each(const uint8_t *bytes, size_t n, infer_input_fn fn, void *context);

#pragma GCC visibility pop

#endif
