/* h2_admission: a new call refused before gRPC has it, on a public port, as Envoy keeps the bounds. While the server
 * runs TRITON_GUARD_MAX_WAITING calls (the waiting bound), while one connection holds its share of them, while the calls
 * cancelling clients left running are at BACKLOG_BOUND (a new call of a connection that cancelled in the last 2 s) or
 * BACKLOG_EVERYONE (anyone's), while a connection that cancelled lately has ORPHANS_PER_CONNECTION calls of its own
 * running for nobody, or while the model's queue time is over its budget (admission), a new ModelInfer call (the header
 * block's :path says which; health, metadata and admin calls wait for nothing) is refused at its first DATA frame: the
 * frame becomes, byte for byte, a RST_STREAM and a frame of a type the server ignores. gRPC hands a unary call to
 * tritonserver only once its message is whole, so a call reset before any byte of it is dropped inside gRPC, never run
 * or cancelled. The client gets UNAVAILABLE in a trailers-only answer with gRPC's retry hint (h2_own_frames.c). A message
 * longer than --max-request-mb (its prefix says) is refused RESOURCE_EXHAUSTED; a ModelStreamInfer stream while
 * streaming is off UNIMPLEMENTED; a call carrying the server's own x-edge-call INVALID_ARGUMENT. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
#include "../../edge/admission_parse.h"
#include "bounds.h"
#include "h2_admission.h"
#include "h2_own_frames.h"
#include "h2_streams.h"
#include "grpc_infer_inputs.h"
#include "http_checks.h"
#include "http_front.h"
#include <stdio.h>

int streaming_served = 0;

/* Admission by queue time: the model named at the start of the message (the DATA frame's payload from at, as far
 * as this read has it) over its budget. A name not within those bytes: admitted (admission sheds load). */
static const char *over_budget(const struct received *in, size_t at, uint32_t length, uint8_t flags) {
    uint8_t lead[ADMISSION_NAME_MAX + 32];
    size_t have = 0, start = at + 9 + ((flags & 0x8) ? 1 : 0), end = at + 9 + length;
    for (size_t p = start; p < end && p < in->total && have < sizeof lead; p++) lead[have++] = *byte_at(in, p);
    const char *name;
    size_t name_length;
    if (!admission_model_from_grpc(lead, have, &name, &name_length)) return NULL;
    return front_admission(name, name_length);
}

/* A call's message longer than the front takes (--max-request-mb, as HTTP bodies): its first DATA frame's prefix (whole
 * in this read: first_call_data held it) says how long. A first frame too short to hold the prefix is one no gRPC
 * client sends: refused as well (its length cannot be known before gRPC holds the message). */
static const char *oversized(const struct received *in, size_t at, uint32_t length, uint8_t flags) {
    size_t lead = (flags & 0x8) ? 1 : 0, prefix = at + 9 + lead;
    if (length < lead + 5 || prefix + 5 > in->total) return TOO_LONG_WHY;
    return u32_at(in, prefix + 1) > front_max_message() ? TOO_LONG_WHY : NULL;
}

/* Why a new call of this connection is refused now, or NULL. */
static const char *refusal_reason(const struct h2_reader *r) {
    int lately = r->cancelled_ns != 0 && front_now_ns() - r->cancelled_ns < RECENT_NS;
    if (lately && r->orphans >= ORPHANS_PER_CONNECTION) return BACKLOG_WHY; /* its own leftovers fill the queue */
    int64_t others = __atomic_load_n(&running_calls, __ATOMIC_RELAXED); /* not counted yet: its message is not whole */
    if (waiting_bound > 0 && r->counted >= SHARE_OF(waiting_bound) && others > r->counted) return SHARE_WHY;
    return front_bounds_refuse(others, lately);
}

/* A new ModelInfer call's first DATA frame (the header whole at position at of in): REFUSED when a bound says so
 * and the frame can carry the refusal (REFUSAL_BYTES or longer). Other calls never are: health, metadata and admin
 * calls are answered without waiting. A ModelStreamInfer stream's first DATA frame that carries bytes, while
 * streaming is off: REFUSED, or where the frame cannot carry the refusal, REFUSAL_CUTS (the connection is cut before
 * gRPC reads it; its calls end as a hung-up client's do). Its header becomes a RST_STREAM's, its payload the reset's
 * code (CANCEL) and the header of a frame of a type the server ignores that covers the rest: the server reads no
 * byte of the message, and the stream it opened at the headers ends with no request run. */
/* The inputs a ModelInfer call's message names, held to the model's rules as an HTTP request's are: 1 and why (an HTTP
 * request's words) where one does not fit. Read from what this read holds of the message's first INFER_LEAD bytes, never
 * waited for (a client writes a call's headers and its message's start together: they come in one read, and holding a
 * frame for them cost a call 0.02 ms on a GPU host); an input not described whole in them is left to tritonserver. */
struct input_check {
    const struct check_rules *rules;
    char *why; /* CHECK_WHY bytes */
};

/* 1 and why where one input does not fit the model's rules (infer_inputs_each's fn). */
static int input_fits(void *context, const uint8_t *model, size_t model_len, const struct infer_input *x) {
    const struct input_check *check = context;
    struct check_verdict verdict;
    if (check_input_tensor(check->rules, (const char *)model, model_len, (const char *)x->name, x->name_len,
                           (const char *)x->datatype, x->datatype_len, x->shape, x->rank, &verdict) == 0)
        return 0;
    snprintf(check->why, CHECK_WHY, "%s", verdict.why);
    return 1;
}

static int wrong_inputs(const struct received *in, size_t at, uint32_t length, uint8_t flags, char why[CHECK_WHY]) {
    const struct check_rules *rules = front_rules();
    size_t pad = (flags & 0x8) ? 1 : 0, start = at + 9 + pad + 5, end = at + 9 + length;
    if (rules == NULL || length < pad + 5 || start >= in->total) return 0;
    size_t n = end - start, message = u32_at(in, at + 9 + pad + 1);
    if (n > in->total - start) n = in->total - start;
    if (n > message) n = message;
    if (n > INFER_LEAD) n = INFER_LEAD;
    uint8_t lead[INFER_LEAD];
    copy_out(in, start, lead, n);
    struct input_check check = {rules, why};
    return infer_inputs_each(lead, n, input_fits, &check);
}

int refused_call(struct h2_reader *r, const struct received *in, size_t at, struct stream_state *known,
                        uint32_t stream, uint32_t length) {
    if (known == NULL || known->state != PEER_OPEN || (known->facts & HAD_DATA)) return NOT_REFUSED;
    int unserved = (known->facts & STREAMING) && !streaming_served, own = (known->facts & OWN_ID) != 0;
    if (!(known->facts & INFERENCE) && !unserved) return NOT_REFUSED;
    if (length == 0) return NOT_REFUSED; /* no byte of a message yet: the next frame is the first */
    known->facts |= HAD_DATA;
    const char *why = unserved ? STREAMING_WHY : own ? OWN_ID_WHY : oversized(in, at, length, r->head[4]);
    const char *code = unserved ? "12" : own ? "3" : why != NULL ? "8" : "14";
    char wrong[CHECK_WHY];
    if (why == NULL && wrong_inputs(in, at, length, r->head[4], wrong)) why = wrong, code = "3"; /* INVALID_ARGUMENT */
    if (why == NULL) why = refusal_reason(r);
    if (why == NULL) why = over_budget(in, at, length, r->head[4]);
    if (why == NULL) return NOT_REFUSED;
    if (length < REFUSAL_BYTES) return REFUSAL_CUTS; /* too short to carry the refusal: never read, as a breaker */
    static const uint8_t reset_head[5] = {0, 0, 4, 3, 0};
    for (int k = 0; k < 5; k++) *byte_at(in, at + k) = reset_head[k];
    uint32_t rest = length - REFUSAL_BYTES;
    uint8_t payload[REFUSAL_BYTES] = {0, 0, 0, 8, (uint8_t)(rest >> 16), (uint8_t)(rest >> 8), (uint8_t)rest,
                                      UNKNOWN_TYPE, 0, 0, 0, 0, 0};
    memcpy(r->refusal, payload, REFUSAL_BYTES);
    r->replace = r->refusal, r->replace_at = 0, r->replace_count = REFUSAL_BYTES;
    table_drop(r, known);
    queue_refusal(r, stream, why, code, length);
    return REFUSED;
}
