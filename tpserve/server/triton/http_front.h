/*
 * http_front: the edge's HTTP checks inside tritonserver's own reads, for a port clients reach directly (no second
 * process on the path). Built into the guard's library (triton_guard.c calls it); see http_front.c.
 */
#ifndef HTTP_FRONT_H
#define HTTP_FRONT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* The shim is preloaded into tritonserver: what it shares between its files stays inside it (only the libc calls
 * it wraps are exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

/* The socket calls the front makes itself (the real ones, past the guard's wrappers). */
struct front_io {
    ssize_t (*recv)(int, void *, size_t, int);
    ssize_t (*write)(int, const void *, size_t);
    int (*ioctl)(int, unsigned long, ...);
};

/* Reads TRITON_GUARD_FRONT_HTTP (ports) and TRITON_GUARD_RULES (the rules file, server/edge/request_checks.py's
 * checks_json) and TRITON_GUARD_FRONT_LIMITS ("max_body_bytes,max_head_bytes,max_connections"), then unsets them.
 * Returns 0, or -1 (and says why on stderr) when ports are named but the rules cannot be read: the server must
 * not then serve those ports unchecked. */
int front_start(const struct front_io *io);

int front_ports(void);    /* how many ports the front reads */
/* The longest gRPC message a client may send, as an HTTP body (--max-request-mb): longer, refused before gRPC holds it. */
uint32_t front_max_message(void);
/* One memory budget for what the front holds for clients (HTTP requests, gRPC frames read whole): n bytes more taken
 * (1), or refused past it (0); given back with front_release. */
int front_hold(size_t n);
void front_release(size_t n);
int front_port(int port); /* whether connections to this local port are read through the front */
int front_accepted(int fd); /* a connection to a front port: watched from now (0), or over the cap: closed (-1) */
void front_forget(int fd);   /* the connection is closed */
int front_watched(int fd);

/* One read of the caller's buffers on a watched connection: checked bytes only, never past a checked request. */
ssize_t front_read(int fd, const struct iovec *iov, size_t parts);

/* FIONREAD on a watched connection: the bytes a read would hand out now (0 while a request is gathered). */
int front_readable(int fd);

/* What tritonserver wrote to a watched connection (sent bytes of iov): its answers, followed to count the requests
 * it still runs. */
void front_wrote(int fd, const struct iovec *iov, size_t parts, size_t sent);

/* The calls tritonserver runs on the ports clients reach directly: HTTP requests handed to it and not yet answered
 * (here) and gRPC calls it has not ended (triton_guard.c); the orphans among the latter (calls their clients
 * cancelled); and the waiting bound (TRITON_GUARD_MAX_WAITING, read by the guard: 0, none). Past the bound, or with
 * BACKLOG_EVERYONE orphans, a new request is refused at once (HTTP 503 with Retry-After, gRPC UNAVAILABLE). */
extern int64_t running_calls, orphaned_calls;
extern long waiting_bound;

/* Admission by queue time (TRITON_GUARD_ADMISSION names the admission table, server/edge/admission_table.py; this
 * server's supervisor marks its region 0): why a new inference of the model named (len bytes) is refused now, or
 * NULL. A refusal is counted in the model's entry, where the supervisor reads it. */
const char *front_admission(const char *name, size_t len);
#define ADMISSION_WHY "the model's queue time is over its budget; retry after 1 s"
#define BACKLOG_BOUND 64     /* orphans that close out the connections that cancelled lately (gRPC) */
#define BACKLOG_EVERYONE 256 /* and everyone */
#define WAITING_WHY "the server runs as many calls as it lets wait (its waiting bound, --max-waiting); retry after 1 s"
#define BACKLOG_WHY "the server is still answering calls their clients cancelled; retry after 1 s"

/* Why a new inference is refused for the bounds, or NULL: others, the calls running besides it (a gRPC stream is
 * counted before its check, an HTTP request after); lately, whether its connection cancelled a call the server
 * still runs within the last 2 s (gRPC: those are closed out first, from BACKLOG_BOUND orphans). */
const char *front_bounds_refuse(int64_t others, int lately);
int64_t front_now_ns(void); /* CLOCK_MONOTONIC */

#pragma GCC visibility pop

#endif
