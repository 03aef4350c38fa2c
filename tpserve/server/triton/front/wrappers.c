/*
 * wrappers: the libc calls the guard wraps in tritonserver (LD_PRELOAD, built into one library with triton_shim.c:
 * preloads.py), and where each hands over. Each door reads exactly the bytes or names tritonserver reads.
 *
 * accept, accept4: a connection to an internal port from another user is closed (own_ports.c); one to a port the
 *   front reads is watched: HTTP/1.1 (http_front.c) or HTTP/2 (h2_streams.c: h2_watch).
 * recv, recvmsg, read, readv, ioctl(FIONREAD): a watched connection is read through the front. HTTP/1.1: only whole
 *   requests that passed the edge's checks (http_front.c, http_checks.c). HTTP/2 (h2_reading.c): behind Envoy, a
 *   client's reset never reaches gRPC as one (tritonserver 2.51 crashes when a call is cancelled while its answer
 *   completes, triton-inference-server/server#8034, #7840); on a public port, gRPC is handed only frames it accepts
 *   (h2_frame_checks.c), new calls past the bounds are refused before gRPC holds them (h2_admission.c, bounds.c), each
 *   call carries its id (call_ids.c), and a client that hangs up or breaks the protocol is hidden from gRPC until the
 *   server has ended its calls (h2_gone.c).
 * send, sendmsg, write, writev: the server's writes to a watched connection are followed (h2_writing.c, http_front.c):
 *   the streams and requests they end, the windows they spend; the guard's own replies go between them.
 * close: a watched connection is forgotten.
 * shm_open: a shared-memory registration of a region the Python backend made for itself is refused (a key holder
 *   could otherwise map the backend's private memory and write model outputs into it).
 *
 * The files below this one call each other downward only (docs/architecture.md): wrappers -> h2_reading ->
 * h2_writing, h2_frame_checks, h2_admission -> h2_gone -> h2_own_frames -> h2_streams -> bounds, call_ids, own_ports,
 * libc_calls; http_front -> http_checks, bounds, call_ids; grpc_headers (HPACK) and grpc_messages (protobuf) are leaves.
 */
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
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/auxv.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "call_ids.h"
#include "bounds.h"
#include "h2_admission.h"
#include "deadlines.h"
#include "h2_reading.h"
#include "h2_streams.h"
#include "h2_writing.h"
#include "http_front.h"
#include "libc_calls.h"
#include "own_ports.h"

#define BACKEND_REGIONS "triton_python_backend"

__attribute__((constructor)) static void start_guard(void) {
    libc_resolve();
    ports_start();
    bounds_start();
    if (public_ports_named() > 0 || getenv("TRITON_GUARD_FRONT_HTTP")) call_ids_start(); /* clients reach it directly */
    const char *streaming = getenv(STREAMING_VARIABLE);
    streaming_served = streaming != NULL && strcmp(streaming, "1") == 0;
    if (streaming != NULL) unsetenv(STREAMING_VARIABLE);
    struct front_io io = {real_recv, real_write, real_ioctl, real_close};
    if (front_start(&io) < 0) _exit(70); /* never serve the front's ports unchecked */
    if (public_ports_named() > 0 && deadlines_start() < 0) {
        guard_say("triton_guard: cannot start the thread that ends slow gRPC clients: not serving the gRPC port\n");
        _exit(70);
    }
}

static void say_full(int port) {
    static unsigned long refused;
    unsigned long n = __atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
    if (n <= 10 || n % 1000 == 0)
        guard_say("triton_guard: refused a connection to gRPC port %d: every connection it may hold runs a call "
                  "(%lu refused so far)\n", port, n);
}

/* conn if it may stay, or -1 once closed; watches it when its port speaks HTTP/2. */
static int admit(int listener, int conn) {
    if (conn < 0 || (ports_named() == 0 && !front_ports())) return conn;
    int port = local_port(listener);
    if (front_port(port)) {
        if (front_accepted(conn) == 0) return conn;
        real_close(conn); /* over the cap of open connections */
        return -1;
    }
    if (own_port(port)) {
        long owner = peer_owner(conn);
        if (owner != (long)geteuid()) {
            say_refused(port, owner);
            real_close(conn);
            return -1;
        }
    }
    if (h2_port(port)) {
        int public = public_port(port);
        if (public && h2_room() < 0) { /* every slot holds a running call: the newcomer waits for one */
            say_full(port);
            real_close(conn);
            return -1;
        }
        h2_watch(conn, public);
        if (public && !h2_watched(conn)) { /* a client's connection is never read unguarded */
            real_close(conn);
            return -1;
        }
    } else {
        h2_forget(conn);
    }
    return conn;
}

int accept4(int fd, struct sockaddr *address, socklen_t *length, int flags) {
    libc_resolve();
    socklen_t given = length ? *length : 0;
    for (;;) { /* a refused connection is closed and the next one taken (EAGAIN on a non-blocking listener) */
        int got = real_accept4(fd, address, length, flags);
        if (got < 0) return got;
        int conn = admit(fd, got);
        if (conn >= 0) return conn;
        if (length) *length = given;
    }
}

int accept(int fd, struct sockaddr *address, socklen_t *length) {
    return accept4(fd, address, length, 0);
}

int close(int fd) {
    libc_resolve();
    if (h2_watched(fd)) h2_forget(fd);
    front_forget(fd);
    return real_close(fd);
}

static ssize_t read_iov(int fd, struct iovec *iov, size_t parts, void *context) {
    (void)context;
    return real_readv(fd, iov, (int)parts);
}

/* recvmsg's message (its control buffer and flags kept) and flags, for a read over other buffers. */
struct message_read {
    struct msghdr *message;
    int flags;
    size_t control; /* the room of its control buffer: the message says 0 unless the socket's own read fills it */
};

static ssize_t read_message(int fd, struct iovec *iov, size_t parts, void *context) {
    struct message_read *call = context;
    struct msghdr plain = {0}, shifted = call->message ? *call->message : plain;
    shifted.msg_iov = iov;
    shifted.msg_iovlen = parts;
    shifted.msg_controllen = call->control;
    ssize_t got = real_recvmsg(fd, &shifted, call->flags);
    if (call->message) {
        call->message->msg_flags = shifted.msg_flags;
        call->message->msg_controllen = shifted.msg_controllen;
        call->message->msg_namelen = shifted.msg_namelen;
    }
    return got;
}

ssize_t recvmsg(int fd, struct msghdr *message, int flags) {
    libc_resolve();
    if (front_watched(fd)) return (flags & MSG_PEEK) ? (errno = EAGAIN, -1) : front_read(fd, message->msg_iov, message->msg_iovlen);
    if (!h2_watched(fd) || (flags & (MSG_PEEK | MSG_ERRQUEUE))) return real_recvmsg(fd, message, flags); /* not the stream */
    /* bytes the guard hands out without reading the socket come with no control message: gRPC then reads again
     * until EAGAIN (with no TCP_INQ message it assumes more may be queued) instead of waiting for an edge */
    struct message_read call = {message, flags, message->msg_controllen};
    message->msg_controllen = 0;
    ssize_t got = guarded_read(fd, message->msg_iov, message->msg_iovlen, read_message, &call);
    /* Bytes left for the next read (a call's id that did not fit): the socket's own TCP_INQ would say nothing is
     * queued, and gRPC would wait for an edge that no client byte may bring (a client waiting for its answer). */
    if (h2_watched(fd) && readers[fd]->ready_count > 0) message->msg_controllen = 0;
    return got;
}

ssize_t recv(int fd, void *buffer, size_t length, int flags) {
    libc_resolve();
    if (front_watched(fd)) {
        struct iovec one = {buffer, length};
        return (flags & MSG_PEEK) ? (errno = EAGAIN, -1) : front_read(fd, &one, 1);
    }
    if (!h2_watched(fd) || (flags & (MSG_PEEK | MSG_ERRQUEUE))) return real_recv(fd, buffer, length, flags);
    struct iovec one = {buffer, length};
    struct message_read call = {NULL, flags, 0};
    return guarded_read(fd, &one, 1, read_message, &call);
}

ssize_t read(int fd, void *buffer, size_t length) {
    libc_resolve();
    struct iovec one = {buffer, length};
    if (front_watched(fd)) return front_read(fd, &one, 1);
    if (!h2_watched(fd)) return real_read(fd, buffer, length);
    return guarded_read(fd, &one, 1, read_iov, NULL);
}

ssize_t readv(int fd, const struct iovec *iov, int parts) {
    libc_resolve();
    if (front_watched(fd) && parts >= 0) return front_read(fd, iov, (size_t)parts);
    if (!h2_watched(fd) || parts < 0) return real_readv(fd, iov, parts);
    return guarded_read(fd, iov, (size_t)parts, read_iov, NULL);
}

/* FIONREAD on a front connection: what a read hands out now, not what the socket holds. */
int ioctl(int fd, unsigned long request, ...) {
    libc_resolve();
    va_list args;
    va_start(args, request);
    void *argument = va_arg(args, void *);
    va_end(args);
    if (request == FIONREAD && front_watched(fd) && argument != NULL) {
        *(int *)argument = front_readable(fd);
        return 0;
    }
    return real_ioctl(fd, request, argument);
}

ssize_t sendmsg(int fd, const struct msghdr *message, int flags) {
    libc_resolve();
    struct h2_reader *r = writing(fd);
    if (held_back(fd, r)) return -1;
    before_writing(fd, message->msg_iov, message->msg_iovlen);
    ssize_t sent = fd_gone(fd) ? 0 : real_sendmsg(fd, message, flags);
    if (h2_watched(fd)) sent = guarded_write(fd, message->msg_iov, message->msg_iovlen, sent);
    if (sent > 0) front_wrote(fd, message->msg_iov, message->msg_iovlen, (size_t)sent);
    return written(fd, r, sent);
}

ssize_t send(int fd, const void *buffer, size_t length, int flags) {
    libc_resolve();
    struct iovec one = {(void *)buffer, length};
    struct h2_reader *r = writing(fd);
    if (held_back(fd, r)) return -1;
    before_writing(fd, &one, 1);
    ssize_t sent = fd_gone(fd) ? 0 : real_send(fd, buffer, length, flags);
    if (h2_watched(fd)) sent = guarded_write(fd, &one, 1, sent);
    if (sent > 0) front_wrote(fd, &one, 1, (size_t)sent);
    return written(fd, r, sent);
}

ssize_t write(int fd, const void *buffer, size_t length) {
    libc_resolve();
    struct iovec one = {(void *)buffer, length};
    struct h2_reader *r = writing(fd);
    if (held_back(fd, r)) return -1;
    before_writing(fd, &one, 1);
    ssize_t sent = fd_gone(fd) ? 0 : real_write(fd, buffer, length);
    if (h2_watched(fd)) sent = guarded_write(fd, &one, 1, sent);
    if (sent > 0) front_wrote(fd, &one, 1, (size_t)sent);
    return written(fd, r, sent);
}

ssize_t writev(int fd, const struct iovec *iov, int parts) {
    libc_resolve();
    struct h2_reader *r = parts >= 0 ? writing(fd) : NULL;
    if (held_back(fd, r)) return -1;
    if (parts >= 0) before_writing(fd, iov, (size_t)parts);
    ssize_t sent = fd_gone(fd) ? 0 : real_writev(fd, iov, parts);
    if (h2_watched(fd) && parts >= 0) sent = guarded_write(fd, iov, (size_t)parts, sent);
    if (sent > 0 && parts >= 0) front_wrote(fd, iov, (size_t)parts, (size_t)sent);
    return written(fd, r, sent);
}

static int from_server_itself(const void *caller) {
    Dl_info at, main_program;
    if (dladdr(caller, &at) == 0 || dladdr((void *)getauxval(AT_ENTRY), &main_program) == 0) return 0;
    return at.dli_fbase == main_program.dli_fbase;
}

static int backend_region(const char *name) {
    while (*name == '/') name++;
    return strncmp(name, BACKEND_REGIONS, strlen(BACKEND_REGIONS)) == 0;
}

int shm_open(const char *name, int flags, mode_t mode) {
    libc_resolve();
    if (name != NULL && !(flags & O_CREAT) && backend_region(name) && from_server_itself(__builtin_return_address(0))) {
        guard_say("triton_guard: refused to register a shared-memory region the server created for itself (a client may "
            "register only regions it created)\n");
        errno = EACCES;
        return -1;
    }
    return real_shm_open(name, flags, mode);
}
