/*
 * http_checks: the HTTP request checks, one implementation for both fronts: inside tritonserver's own reads (the
 * guard, http_front.c), and in Envoy as a dynamic module (server/edge/checks_module.c) where Envoy fronts. One whole
 * request in (method, path, the two headers the checks read, the body: a copy the caller owns and nobody changes),
 * one verdict out. The reading is strict (a body two JSON parsers could read differently is refused); the
 * differential test holds it to what tritonserver reads (tests/functional/test_edge_differential.py).
 */
#ifndef HTTP_CHECKS_H
#define HTTP_CHECKS_H

#include <stddef.h>
#include <stdint.h>

/* The shim is preloaded into tritonserver: what it shares between its files stays inside it (only the libc calls
 * it wraps are exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

struct check_rules; /* the served models' inputs and the limits, from the rules file (check_rules_load) */

/* One input of an inference request as the checks read it: its name and datatype (decoded), its shape. The
 * pointers hold for the length of the call that hands it out. */
struct check_input_seen {
    const char *name;
    size_t name_len;
    const char *datatype;
    size_t datatype_len;
    const int64_t *dims;
    int rank;
};
typedef void (*check_seen_fn)(void *arg, const struct check_input_seen *input);

struct check_request {
    const char *method;
    size_t method_len;
    const char *path; /* the request-target as sent */
    size_t path_len;
    const char *content_encoding; /* NULL: absent */
    size_t content_encoding_len;
    int content_encoding_count; /* how many times the header came: more than once is refused */
    const char *header_length; /* Inference-Header-Content-Length; NULL: absent */
    size_t header_length_len;
    int header_length_count;
    const char *body;
    size_t body_len;
    check_seen_fn seen; /* NULL, or called with each input of an inference request as it passes its checks (a
                           later input may still be refused): Envoy's edge module records them */
    void *seen_arg;
};

#define CHECK_WHY 400
#define CHECK_READING 2048

struct check_verdict {
    int status;               /* 0: the request passes; otherwise the HTTP status it is refused with */
    char why[CHECK_WHY];      /* why it was refused: what was wrong, how to fix it */
    char reading[CHECK_READING]; /* of an inference request that passes: "name:DATATYPE:[dims];..." (tests) */
};

/* The rules from their JSON text (written by server/edge/request_checks.py): NULL and why on a failure. */
struct check_rules *check_rules_load(const char *text, size_t len, char *why, size_t why_room);
void check_rules_free(struct check_rules *rules);

/* The verdict on one whole request. Allocates only while it runs; never reads outside request's buffers. */
void check_http_request(const struct check_rules *rules, const struct check_request *request,
                        struct check_verdict *verdict);

/* The model's max_batch_size as the rules hold it; -1 where the rules do not know the model. */
long check_max_batch_size(const struct check_rules *rules, const char *model, size_t model_len);

/* One input tensor of a call as another protocol carries it (gRPC's ModelInferRequest): its datatype and shape held
 * to the model's rules as an HTTP request's are, in the same words. 0 where it passes (or the model is not one the
 * rules know); otherwise the HTTP status and why in verdict. */
int check_input_tensor(const struct check_rules *rules, const char *model, size_t model_len, const char *name,
                       size_t name_len, const char *datatype, size_t datatype_len, const int64_t *shape, int rank,
                       struct check_verdict *verdict);

#pragma GCC visibility pop

#endif
