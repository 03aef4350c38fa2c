/* bounds: what the front shares between its HTTP/1.1 reading (http_front.c) and its HTTP/2 reading (h2_*.c) to keep the
 * server's bounds as Envoy keeps them: the calls tritonserver runs, the calls cancelling clients left behind, the
 * waiting bound, admission by queue time, the longest message, and one memory budget for all the front holds. */
#ifndef BOUNDS_H
#define BOUNDS_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* The calls tritonserver runs on the ports clients reach directly: HTTP requests handed to it and not yet answered
 * (http_front.c) and gRPC calls it has not answered (h2_streams.c); the orphans among the latter (calls their clients
 * cancelled); and the waiting bound (TRITON_GUARD_MAX_WAITING: 0, none). Past the bound, or with BACKLOG_EVERYONE
 * orphans, a new request is refused at once (HTTP 503 with Retry-After, gRPC UNAVAILABLE). */
extern int64_t running_calls, orphaned_calls;
extern long waiting_bound;

#define ADMISSION_WHY "the model's queue time is over its budget; retry after 1 s"
#define BACKLOG_BOUND 64     /* orphans that close out the connections that cancelled lately (gRPC) */
#define BACKLOG_EVERYONE 256 /* and everyone */
#define WAITING_WHY "the server runs as many calls as it lets wait (its waiting bound, --max-waiting); retry after 1 s"
#define BACKLOG_WHY "the server is still answering calls their clients cancelled; retry after 1 s"

/* Reads (and unsets) TRITON_GUARD_MAX_WAITING, TRITON_GUARD_BACKLOG (this server's slot of the edge's backlog file)
 * and TRITON_GUARD_ADMISSION (the admission table). */
void bounds_start(void);

/* The longest message a client may send (--max-request-mb, HTTP bodies and gRPC messages alike) and the memory budget
 * for all the front holds for clients. */
void front_limits(size_t max_message, size_t max_held, long head_ms, long connections);
long front_max_connections(void); /* a port's open connections at most (HTTP's, and the public gRPC port's) */
uint32_t front_max_message(void);
int64_t front_head_ns(void); /* how long a request's head (a gRPC frame the front holds, a message to begin) may take */

/* One memory budget for what the front holds for clients (HTTP requests, gRPC frames read whole): n bytes more taken
 * (1), or refused past it (0); given back with front_release. */
int front_hold(size_t n);
void front_release(size_t n);

/* Admission by queue time (the admission table, server/edge/admission_table.py; this server's supervisor marks its
 * region 0): why a new inference of the model named (len bytes) is refused now, or NULL. A refusal is counted in the
 * model's entry, where the supervisor reads it. */
const char *front_admission(const char *name, size_t len);

/* Why a new inference is refused for the bounds, or NULL: others, the calls running besides it (a gRPC stream is
 * counted before its check, an HTTP request after); lately, whether its connection cancelled a call the server
 * still runs within the last 2 s (gRPC: those are closed out first, from BACKLOG_BOUND orphans). */
const char *front_bounds_refuse(int64_t others, int lately);

/* The edge's backlog (the calls the edge gave up on that this server still runs): change more. */
void backlog_add(int64_t change);

int64_t front_now_ns(void); /* CLOCK_MONOTONIC */

/* The ports of a comma-separated list in the environment variable (then unset), at most room of them: how many. The
 * guard's port lists (own_ports.c) and the HTTP front's (http_front.c) are read by it. */
int front_port_list(const char *variable, int *ports, int room);

#pragma GCC visibility pop

#endif
