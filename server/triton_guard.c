/*
 * triton_guard: built into the same LD_PRELOAD library as triton_shim.c, it keeps three doors of the embedded
 * tritonserver 2.51 shut that its own code leaves open. Each reads exactly the bytes or names Triton reads.
 *
 * 1. Internal ports are the edge's. TRITON_GUARD_OWN_PORTS lists the ports (the HTTP and gRPC ports behind
 *    Envoy) that only processes of the server's own user may reach. accept() below asks the kernel (sock_diag)
 *    which user owns the connecting socket, and closes a connection of any other user before tritonserver
 *    reads a byte of it: tritonserver 2.51's HTTP parser crashed on 2,000,000 one-byte chunks and on a body
 *    with a duplicated key, and the edge's checks apply only to what passes through the edge.
 *
 * 2. A cancelled gRPC call is never seen as cancelled. tritonserver 2.51's gRPC frontend crashes (SIGSEGV)
 *    when a call is cancelled while its response completes (triton-inference-server/server#8034, #7840). On
 *    the ports in TRITON_GUARD_H2_PORTS (the gRPC port behind Envoy, which holds no client's connection
 *    open: a client that hangs up costs Envoy a stream reset, never the upstream connection, and Envoy strips
 *    grpc-timeout) every RST_STREAM frame the peer sends is rewritten, in place and byte for byte, before gRPC
 *    reads it: for a stream the peer had already half-closed (a unary call, whole before Envoy forwards it) it
 *    becomes a WINDOW_UPDATE of 1 on that stream, which the server ignores; for a stream still open (a
 *    ModelStreamInfer stream) it becomes an empty DATA frame ending the stream, so the server finishes the
 *    stream's requests as if the client had closed its side. Either way the server completes the call and
 *    Envoy drops the answer (the padding counts against the server's receive window, not Envoy's: 4 bytes of
 *    credit per rewritten open stream; docs/security/red_team.md). Only HTTP/2 framing is read (9-byte frame headers after the 24-byte preface),
 *    which has one reading; nothing of a header block or message is touched.
 *
 * 3. Clients register only their own shared memory. A system shared-memory registration makes tritonserver
 *    open the named region (shm_open without O_CREAT, from the server's own code, not a backend's). Below,
 *    such an open of a region named as the Python backend names its IPC regions is refused: a key holder
 *    could otherwise map the backend's private memory and write model outputs into it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define OWN_VARIABLE "TRITON_GUARD_OWN_PORTS"
#define H2_VARIABLE "TRITON_GUARD_H2_PORTS"
#define MAX_PORTS 8
#define MAX_FDS 65536
#define MAX_OPEN 512
#define PREFACE 24
#define BACKEND_REGIONS "triton_python_backend"

static int own_ports[MAX_PORTS], own_count = 0;
static int h2_ports[MAX_PORTS], h2_count = 0;
static unsigned long refusals = 0;

/* One HTTP/2 connection from the peer's side: where its byte stream stands, and its open streams. */
struct h2_reader {
    uint32_t preface_left;
    uint8_t head[9];
    uint32_t head_at;  /* bytes of the current frame header seen (9: in the payload) */
    uint32_t payload_left;
    const uint8_t *replace;  /* the payload bytes to write instead (a rewritten RST_STREAM), or NULL */
    uint32_t replace_at;
    uint32_t open[MAX_OPEN];  /* streams the peer opened and has not half-closed */
    uint32_t open_count;
};

static struct h2_reader *readers[MAX_FDS];

static const uint8_t WINDOW_UPDATE_ONE[4] = {0, 0, 0, 1};
static const uint8_t EMPTY_PADDED[4] = {3, 0, 0, 0}; /* pad length 3, no data, 3 bytes of padding */

static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_shm_open)(const char *, int, mode_t);

static void say(const char *format, ...) {
    char line[512];
    va_list args;
    va_start(args, format);
    int length = vsnprintf(line, sizeof line, format, args);
    va_end(args);
    if (length > 0) (void)!write(2, line, (size_t)length < sizeof line ? (size_t)length : sizeof line - 1);
}

static int read_ports(const char *variable, int *ports) {
    const char *text = getenv(variable);
    int count = 0;
    for (const char *at = text; at && *at && count < MAX_PORTS;) {
        char *end;
        long port = strtol(at, &end, 10);
        if (end == at) break;
        if (port > 0 && port < 65536) ports[count++] = (int)port;
        at = *end == ',' ? end + 1 : end;
    }
    unsetenv(variable);
    return count;
}

/* The functions wrapped here, looked up once: a wrapper can run before any constructor (the shim's own reads
 * the admin key), so each calls this first. */
static void resolve(void) {
    if (real_close != NULL) return;
    real_recvmsg = dlsym(RTLD_NEXT, "recvmsg");
    real_recv = dlsym(RTLD_NEXT, "recv");
    real_read = dlsym(RTLD_NEXT, "read");
    real_readv = dlsym(RTLD_NEXT, "readv");
    real_accept4 = dlsym(RTLD_NEXT, "accept4");
    real_shm_open = dlsym(RTLD_NEXT, "shm_open");
    real_close = dlsym(RTLD_NEXT, "close");
}

__attribute__((constructor)) static void start_guard(void) {
    resolve();
    own_count = read_ports(OWN_VARIABLE, own_ports);
    h2_count = read_ports(H2_VARIABLE, h2_ports);
}

/* ---- 1. who may connect ---- */

static int listed(int port, const int *ports, int count) {
    for (int i = 0; i < count; i++) {
        if (ports[i] == port) return 1;
    }
    return 0;
}

static int local_port(int fd) {
    struct sockaddr_storage address;
    socklen_t length = sizeof address;
    if (getsockname(fd, (struct sockaddr *)&address, &length) != 0) return -1;
    if (address.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&address)->sin_port);
    if (address.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&address)->sin6_port);
    return -1;
}

/* The owner of the TCP socket at the other end of conn, as the kernel knows it (sock_diag); -1 if unknown. */
static long tcp_peer_owner(int conn) {
    struct sockaddr_storage mine, theirs;
    socklen_t mine_length = sizeof mine, theirs_length = sizeof theirs;
    if (getsockname(conn, (struct sockaddr *)&mine, &mine_length) != 0) return -1;
    if (getpeername(conn, (struct sockaddr *)&theirs, &theirs_length) != 0) return -1;
    struct {
        struct nlmsghdr header;
        struct inet_diag_req_v2 request;
    } query;
    memset(&query, 0, sizeof query);
    query.header.nlmsg_len = sizeof query;
    query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    query.header.nlmsg_flags = NLM_F_REQUEST;
    query.request.sdiag_family = (uint8_t)theirs.ss_family;
    query.request.sdiag_protocol = IPPROTO_TCP;
    query.request.idiag_states = ~0U;
    query.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    query.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    if (theirs.ss_family == AF_INET) { /* the peer's socket: its source is their address, its destination ours */
        struct sockaddr_in *a = (struct sockaddr_in *)&theirs, *b = (struct sockaddr_in *)&mine;
        query.request.id.idiag_sport = a->sin_port;
        query.request.id.idiag_dport = b->sin_port;
        memcpy(query.request.id.idiag_src, &a->sin_addr, 4);
        memcpy(query.request.id.idiag_dst, &b->sin_addr, 4);
    } else if (theirs.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&theirs, *b = (struct sockaddr_in6 *)&mine;
        query.request.id.idiag_sport = a->sin6_port;
        query.request.id.idiag_dport = b->sin6_port;
        memcpy(query.request.id.idiag_src, &a->sin6_addr, 16);
        memcpy(query.request.id.idiag_dst, &b->sin6_addr, 16);
    } else {
        return -1;
    }
    int link = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (link < 0) return -1;
    long owner = -1;
    char answer[8192];
    if (send(link, &query, sizeof query, 0) == (ssize_t)sizeof query) {
        ssize_t got = real_recv(link, answer, sizeof answer, 0);
        struct nlmsghdr *header = (struct nlmsghdr *)answer;
        if (got >= (ssize_t)sizeof *header && NLMSG_OK(header, (size_t)got) && header->nlmsg_type == SOCK_DIAG_BY_FAMILY)
            owner = ((struct inet_diag_msg *)NLMSG_DATA(header))->idiag_uid;
    }
    real_close(link);
    return owner;
}

static long peer_owner(int conn) {
    struct ucred credentials;
    socklen_t length = sizeof credentials;
    struct sockaddr_storage mine;
    socklen_t mine_length = sizeof mine;
    if (getsockname(conn, (struct sockaddr *)&mine, &mine_length) == 0 && mine.ss_family == AF_UNIX)
        return getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 ? (long)credentials.uid : -1;
    return tcp_peer_owner(conn);
}

static void say_refused(int port, long owner) {
    refusals++;
    if (refusals <= 10 || refusals % 1000 == 0)
        say("triton_guard: refused a connection to internal port %d from user %ld (only user %ld, the edge's, may "
            "connect; %lu refused so far)\n", port, owner, (long)geteuid(), refusals);
}

static void forget(int fd) {
    if (fd < 0 || fd >= MAX_FDS || readers[fd] == NULL) return;
    struct h2_reader *reader = readers[fd];
    readers[fd] = NULL;
    free(reader);
}

static void watch(int fd) {
    forget(fd);
    if (fd < 0 || fd >= MAX_FDS) return;
    struct h2_reader *reader = calloc(1, sizeof *reader);
    if (reader == NULL) return;
    reader->preface_left = PREFACE;
    readers[fd] = reader;
}

/* conn if it may stay, or -1 once closed; watches it when its port speaks HTTP/2. */
static int admit(int listener, int conn) {
    if (conn < 0 || (own_count == 0 && h2_count == 0)) return conn;
    int port = local_port(listener);
    if (listed(port, own_ports, own_count)) {
        long owner = peer_owner(conn);
        if (owner != (long)geteuid()) {
            say_refused(port, owner);
            real_close(conn);
            return -1;
        }
    }
    if (listed(port, h2_ports, h2_count)) watch(conn);
    else forget(conn);
    return conn;
}

int accept4(int fd, struct sockaddr *address, socklen_t *length, int flags) {
    resolve();
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
    resolve();
    if (fd >= 0 && fd < MAX_FDS && readers[fd] != NULL) forget(fd);
    return real_close(fd);
}

/* ---- 2. RST_STREAM rewritten ---- */

static int open_index(const struct h2_reader *r, uint32_t stream) {
    for (uint32_t i = 0; i < r->open_count; i++) {
        if (r->open[i] == stream) return (int)i;
    }
    return -1;
}

static void close_stream(struct h2_reader *r, uint32_t stream) {
    int at = open_index(r, stream);
    if (at >= 0) r->open[at] = r->open[--r->open_count];
}

static uint32_t stream_of(const uint8_t *id) {
    return ((uint32_t)(id[0] & 0x7f) << 24) | ((uint32_t)id[1] << 16) | ((uint32_t)id[2] << 8) | id[3];
}

/* The header's 9 bytes are known: track the stream it opens or half-closes. */
static void track(struct h2_reader *r) {
    uint8_t type = r->head[3], flags = r->head[4];
    uint32_t stream = stream_of(r->head + 5);
    if (stream == 0 || (type != 0 && type != 1)) return;
    if (flags & 0x1) close_stream(r, stream); /* END_STREAM */
    else if (type == 1 && open_index(r, stream) < 0 && r->open_count < MAX_OPEN) r->open[r->open_count++] = stream;
}

/* The bytes a read returned, as one sequence over its buffers. */
struct received {
    const struct iovec *iov;
    size_t parts;
    size_t total;
};

/* Copies up to want bytes of what was received from position from on, then peeks the socket for the rest;
 * returns how many it has. */
static size_t look_ahead(int fd, const struct received *in, size_t from, uint8_t *out, size_t want) {
    size_t have = 0, start = 0;
    for (size_t p = 0; p < in->parts && have < want && start < in->total; p++) {
        size_t length = in->iov[p].iov_len < in->total - start ? in->iov[p].iov_len : in->total - start;
        for (size_t k = from > start ? from - start : 0; k < length && have < want; k++)
            out[have++] = ((const uint8_t *)in->iov[p].iov_base)[k];
        start += length;
    }
    /* a frame header split between TCP segments: its rest is peeked, waiting for it up to 100 ms */
    for (int tries = 0; have < want && tries < 10; tries++) {
        ssize_t got = real_recv(fd, out + have, want - have, MSG_PEEK | MSG_DONTWAIT);
        if (got >= (ssize_t)(want - have)) return want;
        struct pollfd wait = {fd, POLLIN, 0};
        if (got == 0 || poll(&wait, 1, 10) < 0) break;
    }
    if (have < want) {
        ssize_t got = real_recv(fd, out + have, want - have, MSG_PEEK | MSG_DONTWAIT);
        if (got > 0) have += (size_t)got;
    }
    return have;
}

/* The stream a RST_STREAM names, its type byte at position at: 0 when its id has not arrived yet. */
static uint32_t rst_stream_id(int fd, const struct received *in, size_t at) {
    uint8_t ahead[6];
    return look_ahead(fd, in, at, ahead, sizeof ahead) == sizeof ahead ? stream_of(ahead + 2) : 0;
}

/* The header byte b at position at (r->head_at into its header), rewritten where the frame is a RST_STREAM. */
static uint8_t header_byte(struct h2_reader *r, int fd, uint8_t b, const struct received *in, size_t at) {
    static const uint8_t rst_length[3] = {0, 0, 4};
    if (r->head_at == 3) {
        r->replace = NULL;
        if (b == 3 && memcmp(r->head, rst_length, 3) == 0) {
            uint32_t stream = rst_stream_id(fd, in, at);
            int open = stream != 0 && open_index(r, stream) >= 0;
            r->replace = open ? EMPTY_PADDED : WINDOW_UPDATE_ONE;
            if (open) close_stream(r, stream);
            return open ? 0x0 : 0x8; /* DATA : WINDOW_UPDATE */
        }
    } else if (r->head_at == 4 && r->replace != NULL) {
        return r->replace == EMPTY_PADDED ? 0x9 : 0x0; /* END_STREAM | PADDED : no flags */
    }
    return b;
}

/* Walks one buffer of a read (its bytes at positions base.. of the whole), rewriting RST_STREAM frames. */
static void filter(int fd, struct h2_reader *r, uint8_t *bytes, size_t count, const struct received *in, size_t base) {
    size_t i = 0;
    while (i < count) {
        if (r->preface_left > 0) {
            size_t skip = count - i < r->preface_left ? count - i : r->preface_left;
            r->preface_left -= (uint32_t)skip;
            i += skip;
        } else if (r->head_at < 9) {
            r->head[r->head_at] = bytes[i];
            bytes[i] = header_byte(r, fd, bytes[i], in, base + i);
            if (++r->head_at == 9) {
                if (r->replace == NULL) track(r);
                r->payload_left = ((uint32_t)r->head[0] << 16) | ((uint32_t)r->head[1] << 8) | r->head[2];
                r->replace_at = 0;
                if (r->payload_left == 0) r->head_at = 0;
            }
            i++;
        } else if (r->replace != NULL) {
            bytes[i++] = r->replace[r->replace_at++];
            if (--r->payload_left == 0) r->head_at = 0;
        } else {
            size_t skip = count - i < r->payload_left ? count - i : r->payload_left;
            r->payload_left -= (uint32_t)skip;
            i += skip;
            if (r->payload_left == 0) r->head_at = 0;
        }
    }
}

static void filter_iov(int fd, const struct iovec *iov, size_t parts, size_t total) {
    struct received in = {iov, parts, total};
    size_t base = 0;
    for (size_t p = 0; p < parts && base < total; p++) {
        size_t take = iov[p].iov_len < total - base ? iov[p].iov_len : total - base;
        filter(fd, readers[fd], iov[p].iov_base, take, &in, base);
        base += take;
    }
}

static void filter_buffer(int fd, void *buffer, size_t count) {
    struct iovec one = {buffer, count};
    filter_iov(fd, &one, 1, count);
}

static int watched(int fd) {
    return fd >= 0 && fd < MAX_FDS && readers[fd] != NULL;
}

ssize_t recvmsg(int fd, struct msghdr *message, int flags) {
    resolve();
    ssize_t got = real_recvmsg(fd, message, flags);
    if (got > 0 && watched(fd) && !(flags & MSG_PEEK)) filter_iov(fd, message->msg_iov, message->msg_iovlen, (size_t)got);
    return got;
}

ssize_t recv(int fd, void *buffer, size_t length, int flags) {
    resolve();
    ssize_t got = real_recv(fd, buffer, length, flags);
    if (got > 0 && watched(fd) && !(flags & MSG_PEEK)) filter_buffer(fd, buffer, (size_t)got);
    return got;
}

ssize_t read(int fd, void *buffer, size_t length) {
    resolve();
    ssize_t got = real_read(fd, buffer, length);
    if (got > 0 && watched(fd)) filter_buffer(fd, buffer, (size_t)got);
    return got;
}

ssize_t readv(int fd, const struct iovec *iov, int parts) {
    resolve();
    ssize_t got = real_readv(fd, iov, parts);
    if (got > 0 && watched(fd)) filter_iov(fd, iov, (size_t)parts, (size_t)got);
    return got;
}

/* ---- 3. shared memory the server made is not a client's ---- */

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
    resolve();
    if (name != NULL && !(flags & O_CREAT) && backend_region(name) && from_server_itself(__builtin_return_address(0))) {
        say("triton_guard: refused to register a shared-memory region the server created for itself (a client may "
            "register only regions it created)\n");
        errno = EACCES;
        return -1;
    }
    return real_shm_open(name, flags, mode);
}
