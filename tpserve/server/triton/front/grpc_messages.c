/* The check of grpc_messages.h: a streaming reader of protobuf's wire format with the schema of Triton's
 * ModelInferRequest (grpc_service.proto), one byte at a time, keeping only a stack of the open messages. */
#include "grpc_messages.h"

#include <string.h>

enum { T_REQUEST, T_INPUT, T_OUTPUT, T_ENTRY, T_PARAMETER, T_CONTENTS, T_UNKNOWN };
enum { K_SKIP, K_STRING, K_MESSAGE, K_PACKED_VARINT, K_PACKED_FIXED32, K_PACKED_FIXED64 };
enum { L_MESSAGE, L_GROUP, L_PACKED };
enum { S_TAG, S_VARINT, S_LENGTH, S_FIXED, S_STRING, S_SKIP };

#define INT32_LIMIT 0x7fffffffull

/* What a length-delimited field is read as: {type, field, kind, sub-type}. Not listed: skipped (bytes, unknown
 * fields, and scalar fields sent length-delimited, which protobuf keeps as unknown). */
static const uint8_t RULES[][4] = {
    {T_REQUEST, 1, K_STRING, 0},            /* model_name */
    {T_REQUEST, 2, K_STRING, 0},            /* model_version */
    {T_REQUEST, 3, K_STRING, 0},            /* id */
    {T_REQUEST, 4, K_MESSAGE, T_ENTRY},     /* parameters (map<string, InferParameter>) */
    {T_REQUEST, 5, K_MESSAGE, T_INPUT},     /* inputs */
    {T_REQUEST, 6, K_MESSAGE, T_OUTPUT},    /* outputs */
    {T_INPUT, 1, K_STRING, 0},              /* name */
    {T_INPUT, 2, K_STRING, 0},              /* datatype */
    {T_INPUT, 3, K_PACKED_VARINT, 0},       /* shape (repeated int64) */
    {T_INPUT, 4, K_MESSAGE, T_ENTRY},       /* parameters */
    {T_INPUT, 5, K_MESSAGE, T_CONTENTS},    /* contents */
    {T_OUTPUT, 1, K_STRING, 0},             /* name */
    {T_OUTPUT, 2, K_MESSAGE, T_ENTRY},      /* parameters */
    {T_ENTRY, 1, K_STRING, 0},              /* a map entry's key */
    {T_ENTRY, 2, K_MESSAGE, T_PARAMETER},   /* and value */
    {T_PARAMETER, 3, K_STRING, 0},          /* string_param */
    {T_CONTENTS, 1, K_PACKED_VARINT, 0},    /* bool_contents */
    {T_CONTENTS, 2, K_PACKED_VARINT, 0},    /* int_contents */
    {T_CONTENTS, 3, K_PACKED_VARINT, 0},    /* int64_contents */
    {T_CONTENTS, 4, K_PACKED_VARINT, 0},    /* uint_contents */
    {T_CONTENTS, 5, K_PACKED_VARINT, 0},    /* uint64_contents */
    {T_CONTENTS, 6, K_PACKED_FIXED32, 0},   /* fp32_contents */
    {T_CONTENTS, 7, K_PACKED_FIXED64, 0},   /* fp64_contents */
};

int message_check_rule(int type, int field) {
    for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++) {
        if (RULES[i][0] == type && RULES[i][1] == field) return RULES[i][2] << 8 | RULES[i][3];
    }
    return 0;
}

static void next_message(struct message_check *c) {
    c->prefix_at = 0, c->at = 0, c->length = 0;
    c->state = S_TAG, c->value = 0, c->bytes = 0, c->depth = 0;
    c->stack[0] = (struct pb_level){T_REQUEST, L_MESSAGE, 0, 0};
}

void message_check_start(struct message_check *c) {
    memset(c, 0, sizeof *c);
    next_message(c);
}

/* The innermost length-delimited level's end (groups end at their end-group tag, within it). */
static uint64_t level_end(const struct message_check *c) {
    for (uint32_t d = c->depth;; d--) {
        if (c->stack[d].kind != L_GROUP) return c->stack[d].end;
    }
}

static int push(struct message_check *c, uint8_t type, uint8_t kind, uint32_t group, uint64_t end) {
    if (c->depth >= MESSAGE_DEPTH) return -1;
    c->stack[++c->depth] = (struct pb_level){type, kind, group, end};
    return 0;
}

/* A tag read: what follows it. */
static int tag_read(struct message_check *c, uint64_t tag) {
    if (tag > 0xffffffffull) return -1;
    c->field = (uint32_t)(tag >> 3), c->wire = (uint8_t)(tag & 7);
    if (c->field == 0 || c->wire > 5) return -1;
    struct pb_level *top = &c->stack[c->depth];
    switch (c->wire) {
    case 0: c->state = S_VARINT; return 0;
    case 1: case 5: {
        uint64_t n = c->wire == 1 ? 8 : 4;
        if (c->at + n > level_end(c)) return -1;
        c->token_end = c->at + n, c->state = S_FIXED;
        return 0;
    }
    case 2: c->state = S_LENGTH; return 0;
    case 3: c->state = S_TAG; return push(c, T_UNKNOWN, L_GROUP, c->field, 0);
    default: /* 4: the end of the group open innermost, of the same field */
        if (top->kind != L_GROUP || top->group != c->field) return -1;
        c->depth--;
        c->state = S_TAG;
        return 0;
    }
}

/* A length read: the field's bytes, read as its kind. */
static int length_read(struct message_check *c, uint64_t length) {
    if (length > INT32_LIMIT || c->at + length > level_end(c)) return -1;
    struct pb_level *top = &c->stack[c->depth];
    int rule = top->kind == L_MESSAGE ? message_check_rule(top->type, (int)c->field) : 0;
    int kind = rule >> 8;
    uint64_t end = c->at + length;
    c->state = S_TAG;
    switch (kind) {
    case K_STRING: c->token_end = end, c->utf8_need = 0, c->state = length ? S_STRING : S_TAG; return 0;
    case K_MESSAGE: return push(c, (uint8_t)(rule & 0xff), L_MESSAGE, 0, end);
    case K_PACKED_VARINT: return push(c, T_UNKNOWN, L_PACKED, 0, end);
    case K_PACKED_FIXED32: case K_PACKED_FIXED64:
        if (length % (kind == K_PACKED_FIXED32 ? 4 : 8) != 0) return -1;
        /* fall through */
    default: c->token_end = end, c->state = length ? S_SKIP : S_TAG; return 0;
    }
}

/* A byte of a varint (a tag, a length, a value): 1 when it is the last, -1 past 10 bytes or 64 bits. */
static int varint_byte(struct message_check *c, uint8_t byte) {
    if (c->bytes == 9 && byte > 1) return -1;
    c->value |= (uint64_t)(byte & 0x7f) << (7 * c->bytes);
    c->bytes++;
    if (byte & 0x80) return c->bytes == 10 ? -1 : 0;
    return 1;
}

/* One byte of UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static int utf8_byte(struct message_check *c, uint8_t b) {
    if (c->utf8_need > 0) {
        if (b < c->utf8_low || b > c->utf8_high) return -1;
        c->utf8_need--, c->utf8_low = 0x80, c->utf8_high = 0xbf;
        return 0;
    }
    c->utf8_low = 0x80, c->utf8_high = 0xbf;
    if (b < 0x80) return 0;
    if (b < 0xc2 || b > 0xf4) return -1;
    if (b < 0xe0) c->utf8_need = 1;
    else if (b < 0xf0) c->utf8_need = 2;
    else c->utf8_need = 3;
    if (b == 0xe0) c->utf8_low = 0xa0;
    if (b == 0xed) c->utf8_high = 0x9f;
    if (b == 0xf0) c->utf8_low = 0x90;
    if (b == 0xf4) c->utf8_high = 0x8f;
    return 0;
}

/* One byte of the body: -1 where the message cannot be read. */
static int body_byte(struct message_check *c, uint8_t b) {
    struct pb_level *top = &c->stack[c->depth];
    int done;
    c->at++;
    if (top->kind == L_PACKED) { /* varints back to back */
        if ((done = varint_byte(c, b)) < 0) return -1;
        if (done) c->value = 0, c->bytes = 0;
        return 0;
    }
    switch (c->state) {
    case S_TAG: case S_VARINT: case S_LENGTH:
        if ((done = varint_byte(c, b)) < 0 || (c->state != S_VARINT && c->bytes > 5)) return -1; /* 32-bit ones */
        if (done == 0) return 0;
        {
            uint64_t value = c->value;
            c->value = 0, c->bytes = 0;
            if (c->state == S_TAG) return tag_read(c, value);
            if (c->state == S_LENGTH) return length_read(c, value);
            c->state = S_TAG;
            return 0;
        }
    case S_STRING:
        if (utf8_byte(c, b) < 0) return -1;
        if (c->at == c->token_end) {
            if (c->utf8_need > 0) return -1;
            c->state = S_TAG;
        }
        return 0;
    default: /* S_FIXED, S_SKIP */
        if (c->at == c->token_end) c->state = S_TAG;
        return 0;
    }
}

/* Levels ending here close, each only between its fields (a packed one between its varints). */
static int close_levels(struct message_check *c) {
    while (c->depth > 0 && c->stack[c->depth].kind != L_GROUP && c->stack[c->depth].end == c->at) {
        if (c->bytes != 0 || c->state != S_TAG) return -1; /* mid-varint (a tag's too), or mid-field */
        c->depth--;
    }
    return 0;
}

/* Bulk bytes of a field skipped whole (bytes, unknown lengths, fixed values): as many as are here. */
static size_t skip_run(struct message_check *c, size_t n) {
    if (c->stack[c->depth].kind == L_PACKED || (c->state != S_SKIP && c->state != S_FIXED)) return 0;
    uint64_t left = c->token_end - c->at;
    if (left <= 1) return 0; /* the last byte goes through body_byte, which closes the field */
    size_t take = left - 1 < n ? (size_t)(left - 1) : n;
    c->at += take;
    return take;
}

int message_check_feed(struct message_check *c, const uint8_t *bytes, size_t n) {
    for (size_t i = 0; i < n && !c->bad;) {
        if (c->prefix_at < 5) {
            c->prefix[c->prefix_at++] = bytes[i++];
            if (c->prefix_at < 5) continue;
            c->length = (uint64_t)c->prefix[1] << 24 | (uint64_t)c->prefix[2] << 16 | (uint64_t)c->prefix[3] << 8 |
                        c->prefix[4];
            c->stack[0].end = c->length;
            if (c->prefix[0] != 0 || c->length > INT32_LIMIT) c->bad = 1; /* compressed, or past gRPC's limit */
        } else {
            size_t skipped = skip_run(c, n - i);
            i += skipped;
            if (skipped == 0 && (body_byte(c, bytes[i++]) < 0 || close_levels(c) < 0)) c->bad = 1;
        }
        if (!c->bad && c->prefix_at == 5 && c->at == c->length) { /* the message is whole */
            if (c->depth != 0 || c->state != S_TAG || c->bytes != 0) c->bad = 1;
            else c->messages++, next_message(c);
        }
    }
    return c->bad ? -1 : 0;
}
