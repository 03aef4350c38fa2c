/*
 * http_front: the edge's HTTP checks inside tritonserver's own reads, for a port clients reach directly (no second
 * process on the path). Built into the guard's library (wrappers.c calls it); see http_front.c.
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

struct check_rules; /* http_checks.h */

/* The socket calls the front makes itself (the real ones, past the guard's wrappers). */
struct front_io {
    ssize_t (*socket_recv)(int, void *, size_t, int);
    ssize_t (*socket_write)(int, const void *, size_t);
    int (*socket_ioctl)(int, unsigned long, ...);
    int (*socket_close)(int);
};

/* Reads TRITON_GUARD_FRONT_HTTP (ports) and TRITON_GUARD_RULES (the rules file, server/edge/request_checks.py's
 * checks_json) and TRITON_GUARD_FRONT_LIMITS ("max_body_bytes,max_head_bytes,max_connections,budget,head_ms"), then
 * unsets them.
 * Returns 0, or -1 (and says why on stderr) when ports are named but the rules cannot be read: the server must
 * not then serve those ports unchecked. */
int front_start(const struct front_io *io);

int front_ports(void);    /* how many ports the front reads */
/* The checks' rules (the served models' inputs), or NULL where the HTTP checks do not run. */
const struct check_rules *front_rules(void);
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

#pragma GCC visibility pop

#endif
