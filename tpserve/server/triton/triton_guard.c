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
 *    credit per rewritten open stream; docs/security/red_team.md). Only HTTP/2 framing is read (9-byte frame headers
 *    after the 24-byte preface), which has one reading; nothing of a header block or message is touched. Every
 *    frame header handed to gRPC is whole: one a read ends in is held back (at most 8 bytes) and handed out with
 *    the next read, so a split frame never waits for its rest. The server's writes are followed too: a stream
 *    either side ends leaves the table of open streams, which grows as needed (no cap a client can fill).
 *
 * 2b. On the ports also in TRITON_GUARD_H2_PUBLIC (tritonserver's gRPC port where clients reach it directly:
 *    `--checks-in-server`), nobody holds a client's connection open, so the guard holds what Envoy held: a deadline's
 *    grpc-timeout is renamed in header blocks as they pass (grpc_headers.c); a hang-up (the read's end or error, or
 *    a write's) is hidden from gRPC until the server has ended every call of the connection (the streams the client
 *    left open ended as if it had, the server's writes counted as sent and their flow-control credit handed back),
 *    then the socket's reading side is shut down to wake gRPC's edge-triggered poller into reading the end; a frame
 *    that would make gRPC reset a running call or end the connection (breaking a stream's state, the framing, flow
 *    control as both sides announced it, or HPACK: header blocks and small control frames are read whole first, and
 *    blocks are checked against the server's table, grpc_headers.c) is never read, nor anything after it, and the
 *    connection counts as hung up.
 *
 * 2c. Bounds, on a public port as Envoy keeps them: while the server runs TRITON_GUARD_MAX_WAITING calls (the waiting
 *    bound, server/edge/admission.py), or while the calls cancelling clients left running are at BACKLOG_BOUND (a
 *    new call of a connection that cancelled in the last 2 s) or BACKLOG_EVERYONE (anyone's), or while a connection
 *    that cancelled in the last 2 s has ORPHANS_PER_CONNECTION calls of its own running for nobody, a new ModelInfer call
 *    (the header block's :path says which, grpc_headers.c; health, metadata and admin calls wait for nothing) is
 *    refused before gRPC has it: its first DATA frame becomes, byte for byte, a RST_STREAM and a frame of a type the
 *    server ignores. gRPC hands a unary call to tritonserver only once its request message is whole, so a call reset
 *    before any byte of its message is dropped inside gRPC and never run or cancelled. The client gets UNAVAILABLE
 *    in a trailers-only answer (static HPACK only: neither side's table changes) with gRPC's retry hint, written
 *    between the server's frames, and the connection's window back for the bytes the server never read.
 *
 * 2d. Calls nobody waits for, on a public port (call_ids.h): where the server has a cancelled-calls table, each new
 *    ModelInfer call's header block is handed to gRPC with one more frame: its last frame's END_HEADERS is cleared and
 *    a CONTINUATION follows with END_HEADERS and one field, x-edge-call: the call's id (a literal without indexing and
 *    a new name: neither side's HPACK table changes). When the client resets the call or hangs up before the server
 *    ended it, the id goes into the table and the model answers the call unrun. A call whose own header block
 *    carries an x-edge-call field (a literal, or from the table) is refused at its first DATA frame, INVALID_ARGUMENT.
 *    At most IDS_PER_READ calls a read get an id (the bytes a read hands out past the caller's room wait in ready);
 *    past it, a call gets none and is computed if cancelled, as before.
 *
 * 4. (http_front.c) On the ports in TRITON_GUARD_FRONT_HTTP, clients reach tritonserver's HTTP port directly and the
 *    edge's HTTP checks run inside its reads: it is handed only whole requests that passed them.
 *
 * 3. Clients register only their own shared memory. A system shared-memory registration makes tritonserver
 *    open the named region (shm_open without O_CREAT, from the server's own code, not a backend's). Below,
 *    such an open of a region named as the Python backend names its IPC regions is refused: a key holder
 *    could otherwise map the backend's private memory and write model outputs into it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <sys/auxv.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../edge/admission_parse.h"
#include "call_ids.h"
#include "grpc_headers.h"
#include "grpc_messages.h"
#include "http_front.h"

#define OWN_VARIABLE "TRITON_GUARD_OWN_PORTS"
#define H2_VARIABLE "TRITON_GUARD_H2_PORTS"
#define PUBLIC_VARIABLE "TRITON_GUARD_H2_PUBLIC"
#define BACKLOG_VARIABLE "TRITON_GUARD_BACKLOG"
#define BACKLOG_SLOTS 64
#define BACKLOG_LINE 64 /* bytes per slot: one cache line each */
#define MAX_PORTS 8
#define MAX_FDS 65536
#define PREFACE 24
#define CONTROL_CAP 96 /* the longest control frame a public port reads whole before gRPC does (16 SETTINGS) */
#define HELD_ROOM (9 + CONTROL_CAP)
#define BLOCK_CAP 20480 /* the longest header block (its frames) a public port reads whole: gRPC takes 16 KiB of headers */
#define HOLD_CAP (9 + BLOCK_CAP)
#define KEEP_ROOM (64 * 1024) /* held and ready rooms larger than this are given back once empty */
#define WINDOW_MAX 0x7fffffffLL
#define DEFAULT_WINDOW 65535
#define UNKNOWN_TYPE 0xfa /* a frame type RFC 7540 has the server ignore: what a client's GOAWAY is read as */
#define BACKEND_REGIONS "triton_python_backend"
#define WAITING_VARIABLE "TRITON_GUARD_MAX_WAITING"
#define RECENT_NS 2000000000LL /* a connection cancelled "lately": within 2 s */
/* the calls one connection may leave running for nobody: past them, while it cancels, its new calls are refused (a
 * model's queue is often smaller than the server's bound, and one cancelling client would keep it full) */
#define ORPHANS_PER_CONNECTION 4
/* one connection's share of the waiting bound while other connections' calls wait too (Envoy keeps per-connection
 * limits likewise): one client's connection never holds every place */
#define TOO_LONG_WHY "the message is over the edge's limit (--max-request-mb)"
#define SHARE_OF(bound) ((bound) / 2 > 0 ? (bound) / 2 : 1)
#define SHARE_WHY "this connection runs its share of the calls the server lets wait (--max-waiting); retry after 1 s"
/* a connection's streams: the peer's at most (more: cut, as Envoy's and nghttp2's per-connection stream limits do), and
 * of them at most so many whose message is still to come (each holds gRPC's memory and no call) */
#define STREAMS_PER_CONNECTION 1024
#define OPEN_PER_CONNECTION 128
#define REPLY_CAP 65536       /* the guard's unsent frames for one client: past this it is not reading them (cut) */
#define SETTINGS_CAP 100      /* a client's SETTINGS frames: each makes the server queue an ACK (more: cut) */
#define REFUSAL_BYTES 13      /* a first DATA frame this long or longer can become a RST_STREAM and an ignored frame */
#define IDS_PER_READ 256 /* calls given an id in one read: the bytes added (39 each) fit a held unit's room */
#define ID_FRAME 39      /* a CONTINUATION of one field: x-edge-call, 16 hex digits */
#define OWN_ID_WHY "x-edge-call is the server's own header (each call's id): leave it out"
#define STREAMING_VARIABLE "TRITON_GUARD_STREAMING" /* 1: ModelStreamInfer served on the public port */
#define STREAMING_WHY \
    "ModelStreamInfer is not served here: tritonserver 2.51 crashes under concurrent streams; unary ModelInfer is served"
/* a refusal's grpc-message is one HPACK string of a one-byte length: under 127 bytes */
_Static_assert(sizeof STREAMING_WHY <= 127 && sizeof WAITING_WHY <= 127 && sizeof BACKLOG_WHY <= 127, "too long");
_Static_assert(sizeof SHARE_WHY <= 127, "too long");
_Static_assert(sizeof OWN_ID_WHY <= 127 && IDS_PER_READ * ID_FRAME <= BLOCK_CAP, "too long");
enum { NOT_REFUSED = 0, REFUSED = 1, REFUSAL_CUTS = 2 };

static int own_ports[MAX_PORTS], own_count = 0;
static int h2_ports[MAX_PORTS], h2_count = 0;
static int public_ports[MAX_PORTS], public_count = 0;
static unsigned long refusals = 0;
static unsigned long refused_calls = 0;
static int streaming_served = 0; /* ModelStreamInfer on the public port (off: each stream refused, docs/security.md) */

/* A stream the peer opened and the server has not ended: still open on the peer's side (a ModelStreamInfer
 * stream), half-closed by it (a unary call, whole), or reset by it (nobody waits: an orphan the server still runs). */
enum { PEER_OPEN = 1, RUNNING = 2, ORPHAN = 3 };
/* facts: ModelInfer; its first DATA came; ModelStreamInfer; its header block carried an x-edge-call of the client's;
 * counted among the calls the server runs (running_calls: from the client's end of its side, or its reset, until the
 * server's answer begins); the server began its answer (its HEADERS: what is left is writing it, which a client that
 * never reads can hold up, and which the waiting bound does not count) */
enum { INFERENCE = 1, HAD_DATA = 2, STREAMING = 4, OWN_ID = 8, COUNTED = 16, ANSWERED = 32 };
struct stream_state {
    uint32_t stream;  /* 0: a free slot */
    uint16_t state;
    uint16_t facts;
    struct message_check *check; /* a ModelStreamInfer stream's messages, as tritonserver's protobuf reads them */
    int64_t recv;  /* public ports: what the client may still send on it (the windows the server announced) */
    int64_t send;  /* public ports: what the server may still send on it (the windows the client announced) */
    uint64_t call; /* public ports: the call's id (2d; 0: none) */
};

/* A call's id to hand out after its header block (2d): the block ends before position after of the read, its last
 * frame's header starts at last. */
struct id_insert {
    size_t after, last;
    uint32_t stream;
    uint64_t id;
};

/* Where the server's own byte stream stands, as it writes it. */
struct out_parser {
    uint8_t head[9];
    uint32_t head_at, payload_left;
    uint8_t type, settings;  /* settings: the frame is a SETTINGS (not an ACK) */
    uint8_t in_block;        /* inside a header block (HEADERS or CONTINUATION without END_HEADERS so far) */
    uint32_t stream;
    uint8_t setting[6], window[4];  /* a SETTINGS entry, a WINDOW_UPDATE's increment, as they come */
    uint32_t setting_at, window_at;
    uint64_t offset;  /* the server's bytes so far */
};

/* One HTTP/2 connection: where the peer's byte stream stands, its streams the server has not ended, and where the
 * server's own byte stream stands (its writes end streams). */
struct h2_reader {
    uint32_t preface_left;
    uint8_t head[9];
    uint32_t head_at;  /* bytes of the current frame header seen (9: in the payload) */
    uint32_t payload_left;
    const uint8_t *replace;  /* the payload bytes to write instead (a rewritten RST_STREAM), or NULL */
    uint32_t replace_at, replace_count;
    uint8_t refusal[REFUSAL_BYTES]; /* what a refused call's first DATA frame's payload starts as instead */
    uint8_t *held;  /* the start of a frame header a read ended in (on a public port, of a control frame with its
                     * payload, or of a whole header block), not yet decided: read again whole */
    uint32_t held_count;
    uint8_t *ready;  /* a decided header's bytes a short read had no room for: handed out first (from ready_at) */
    uint32_t ready_at;
    uint32_t hold_room;  /* of held and of ready: 9 bytes, on a public port up to HOLD_CAP */
    uint32_t ready_count;
    pthread_mutex_t lock;  /* the table: gRPC may write (server_wrote) while it reads */
    struct stream_state *streams;  /* the peer's streams the server has not ended: grown as needed, no fixed cap */
    uint32_t stream_count, stream_room;  /* stream_room: 0 or a power of two (open addressing) */
    uint32_t orphans;  /* streams the peer reset that the server still runs (and has not begun to answer) */
    uint32_t counted;  /* its streams counted in running_calls */
    uint32_t peer_open; /* its streams the peer has not ended its side of (a call whose message is still to come) */
    struct out_parser out;  /* the server's frames, as it writes them */
    uint64_t credited;      /* public ports: the server's bytes whose window changes are counted (before sending) */
    /* a public port's (TRITON_GUARD_H2_PUBLIC: clients connect straight to gRPC, no Envoy between) */
    uint8_t public;
    uint8_t gone;             /* the peer hung up or broke the protocol: gRPC reads nothing more of it */
    uint8_t block;            /* the payload being read carries a header block fragment */
    uint8_t padded;           /* its first byte is a pad length, still to come */
    uint32_t lead, trail;     /* payload bytes before the fragment (pad length, priority) and after (padding) */
    uint32_t payload_at;      /* payload bytes read of the current frame */
    uint32_t last_stream;     /* the highest stream the peer opened */
    uint32_t continuing;      /* the stream whose header block goes on in CONTINUATION frames (0: none) */
    uint32_t block_stream;    /* the stream of the last header block begun */
    uint32_t max_frame;       /* the longest frame the server allows (the largest the client acknowledged; 16384 before) */
    /* flow control as both sides announced it (RFC 7540 6.9): a frame that overruns a window is never read */
    uint32_t client_initial;  /* SETTINGS_INITIAL_WINDOW_SIZE the client announced */
    uint32_t server_initial;  /* the largest the client acknowledged (a lower one later is not enforced) */
    /* the server's SETTINGS the client has not acknowledged yet, oldest first: gRPC holds a client to a setting only
     * once the client's SETTINGS ACK says it has it (RFC 7540 6.5.3), and so does the guard. Before, the guard took
     * the server's 4 MiB frames at once: a client that never acknowledged sent a frame gRPC still refused (16 KiB),
     * gRPC ended the connection and cancelled its calls, and tritonserver crashed. Per entry: the HPACK table size,
     * the initial window, the longest frame (UINT32_MAX: not in that frame). */
    uint32_t announcing[3];
    uint32_t unacked[8][3];
    uint8_t unacked_count;
    int64_t conn_recv, conn_send;  /* the connection's windows: the client's sending, the server's */
    size_t cut;               /* where in the read a frame gRPC must never see starts (SIZE_MAX: none) */
    struct hpack_walk walk;   /* the header block being read: grpc-timeout renamed (grpc_headers.c) */
    struct hpack_table table; /* the server's HPACK table as the client's checked blocks change it */
    uint8_t *synth;           /* frames of the gone peer's to hand out (stream ends, window credit) */
    size_t synth_count, synth_room;
    /* refusals (2c) */
    uint8_t block_path;       /* what the header block being read names (HPACK_PATH_*) */
    uint8_t block_own;        /* it carries an x-edge-call field of the client's */
    size_t block_after, block_last; /* where the block begun in this read ends, and its last frame starts (0: none) */
    struct id_insert *inserts; /* the ids this read hands out (2d), in the order of their blocks */
    size_t insert_count, insert_room;
    uint8_t table_resized;    /* the client announced an HPACK table size the server has not written a block since */
    uint8_t mid_reply;        /* some of the replies is sent: the server writes nothing until the rest is */
    uint32_t settings_seen;   /* the client's SETTINGS frames (not ACKs) */
    int64_t cancelled_ns;     /* when the client last cancelled a call the server runs (CLOCK_MONOTONIC) */
    size_t budgeted;          /* bytes of the front's memory budget its held and ready rooms take (past HOLD_CAP) */
    uint8_t starved;          /* the budget refused it a room: cut */
    uint8_t *reply;           /* the guard's own frames for the client (refusals, window credit), unsent */
    size_t reply_count, reply_room;
    pthread_mutex_t wlock;    /* the connection's writes: the server's and the guard's never interleave */
};

static struct h2_reader *readers[MAX_FDS];

/* The edge's backlog: this server's slot of the file TRITON_GUARD_BACKLOG names ("slot:path", a file of the state
 * folder, 0600, made by the launcher: server/edge/cancel_table.py), counting the calls the edge gave up on that this
 * server still runs. The edge reads every slot and refuses new calls while the sum is over its bound
 * (server/edge/cancel_notice.c): what cancelling clients leave behind stays bounded. NULL: not behind the edge. */
static uint64_t *backlog = NULL;

static void count_orphans(struct h2_reader *r, int64_t change) {
    r->orphans = (uint32_t)((int64_t)r->orphans + change);
    if (r->public) __atomic_add_fetch(&orphaned_calls, change, __ATOMIC_RELAXED);
    if (backlog != NULL) __atomic_add_fetch(backlog, (uint64_t)change, __ATOMIC_RELAXED);
}

static const uint8_t WINDOW_UPDATE_ONE[4] = {0, 0, 0, 1};
static const uint8_t EMPTY_PADDED[4] = {3, 0, 0, 0}; /* pad length 3, no data, 3 bytes of padding */

static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_shm_open)(const char *, int, mode_t);
static int (*real_ioctl)(int, unsigned long, ...);

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
    real_sendmsg = dlsym(RTLD_NEXT, "sendmsg");
    real_send = dlsym(RTLD_NEXT, "send");
    real_write = dlsym(RTLD_NEXT, "write");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_accept4 = dlsym(RTLD_NEXT, "accept4");
    real_shm_open = dlsym(RTLD_NEXT, "shm_open");
    real_ioctl = dlsym(RTLD_NEXT, "ioctl");
    real_close = dlsym(RTLD_NEXT, "close");
}

/* This server's slot of the backlog file ("slot:path"), zeroed: the calls of a server that was before it are gone. */
static void open_backlog(void) {
    const char *text = getenv(BACKLOG_VARIABLE);
    char *path = NULL;
    long slot = text ? strtol(text, &path, 10) : -1;
    if (slot >= 0 && slot < BACKLOG_SLOTS && path != NULL && *path == ':') {
        int fd = open(path + 1, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        void *map = MAP_FAILED;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077) &&
            st.st_size == BACKLOG_SLOTS * BACKLOG_LINE)
            map = mmap(NULL, BACKLOG_SLOTS * BACKLOG_LINE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0) real_close(fd);
        if (map != MAP_FAILED) {
            backlog = (uint64_t *)((uint8_t *)map + slot * BACKLOG_LINE);
            __atomic_store_n(backlog, 0, __ATOMIC_RELAXED);
        } else {
            say("triton_guard: cannot use the backlog file %s (not a 0600 file of this user of %d bytes): the edge "
                "does not see what cancelled calls leave behind\n", path + 1, BACKLOG_SLOTS * BACKLOG_LINE);
        }
    }
    if (text != NULL) unsetenv(BACKLOG_VARIABLE);
}

static void settings_acked(struct h2_reader *r);

__attribute__((constructor)) static void start_guard(void) {
    resolve();
    own_count = read_ports(OWN_VARIABLE, own_ports);
    h2_count = read_ports(H2_VARIABLE, h2_ports);
    public_count = read_ports(PUBLIC_VARIABLE, public_ports);
    open_backlog();
    if (public_count > 0 || getenv("TRITON_GUARD_FRONT_HTTP")) call_ids_start(); /* where clients reach it directly */
    const char *waiting = getenv(WAITING_VARIABLE);
    if (waiting != NULL) {
        waiting_bound = strtol(waiting, NULL, 10) > 0 ? strtol(waiting, NULL, 10) : 0;
        unsetenv(WAITING_VARIABLE);
    }
    const char *streaming = getenv(STREAMING_VARIABLE);
    streaming_served = streaming != NULL && strcmp(streaming, "1") == 0;
    if (streaming != NULL) unsetenv(STREAMING_VARIABLE);
    struct front_io io = {real_recv, real_write, real_ioctl};
    if (front_start(&io) < 0) _exit(70); /* never serve the front's ports unchecked */
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
    count_orphans(reader, -(int64_t)reader->orphans); /* the connection is gone: so are its calls */
    if (reader->public) __atomic_sub_fetch(&running_calls, (int64_t)reader->counted, __ATOMIC_RELAXED);
    int trim = reader->hold_room > KEEP_ROOM;
    front_release(reader->budgeted);
    for (uint32_t i = 0; i < reader->stream_room; i++) {
        free(reader->streams[i].check);
        if (reader->streams[i].stream != 0) call_id_cancelled(reader->streams[i].call); /* nobody reads its answer */
    }
    free(reader->inserts);
    pthread_mutex_destroy(&reader->lock);
    pthread_mutex_destroy(&reader->wlock);
    free(reader->reply);
    free(reader->streams);
    free(reader->synth);
    free(reader->held);
    free(reader->ready);
    free(reader);
    if (trim) malloc_trim(0); /* a large frame was held: its memory goes back to the system */
}

static void watch(int fd, int public) {
    forget(fd);
    if (fd < 0 || fd >= MAX_FDS) return;
    struct h2_reader *reader = calloc(1, sizeof *reader);
    if (reader == NULL) return;
    reader->preface_left = PREFACE;
    reader->public = (uint8_t)public;
    reader->hold_room = public ? HELD_ROOM : 9;
    reader->held = malloc(reader->hold_room), reader->ready = malloc(reader->hold_room);
    if (reader->held == NULL || reader->ready == NULL) {
        free(reader->held), free(reader->ready), free(reader);
        return;
    }
    if (public) hpack_table_start(&reader->table);
    reader->cut = SIZE_MAX;
    reader->max_frame = 16384;
    reader->client_initial = reader->server_initial = DEFAULT_WINDOW;
    reader->conn_recv = reader->conn_send = DEFAULT_WINDOW;
    pthread_mutex_init(&reader->lock, NULL);
    pthread_mutex_init(&reader->wlock, NULL);
    readers[fd] = reader;
}

/* conn if it may stay, or -1 once closed; watches it when its port speaks HTTP/2. */
static int admit(int listener, int conn) {
    if (conn < 0 || (own_count == 0 && h2_count == 0 && !front_ports())) return conn;
    int port = local_port(listener);
    if (front_port(port)) {
        if (front_accepted(conn) == 0) return conn;
        real_close(conn); /* over the cap of open connections */
        return -1;
    }
    if (listed(port, own_ports, own_count)) {
        long owner = peer_owner(conn);
        if (owner != (long)geteuid()) {
            say_refused(port, owner);
            real_close(conn);
            return -1;
        }
    }
    if (listed(port, h2_ports, h2_count)) {
        int public = listed(port, public_ports, public_count);
        watch(conn, public);
        if (public && (conn >= MAX_FDS || readers[conn] == NULL)) { /* a client's connection is never read unguarded */
            real_close(conn);
            return -1;
        }
    } else {
        forget(conn);
    }
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
    front_forget(fd);
    return real_close(fd);
}

/* ---- 2. RST_STREAM rewritten ---- */

static uint32_t slot_of(uint32_t stream, uint32_t room) {
    return (stream * 2654435761u) & (room - 1);
}

static struct stream_state *table_find(const struct h2_reader *r, uint32_t stream) {
    if (r->stream_room == 0 || stream == 0) return NULL;
    for (uint32_t i = slot_of(stream, r->stream_room);; i = (i + 1) & (r->stream_room - 1)) {
        if (r->streams[i].stream == stream) return &r->streams[i];
        if (r->streams[i].stream == 0) return NULL;
    }
}

/* Room for one more (the table kept at most half full); 0 when out of memory. */
static int make_room(struct h2_reader *r) {
    if ((r->stream_count + 1) * 2 <= r->stream_room) return 1;
    uint32_t room = r->stream_room ? r->stream_room * 2 : 64;
    if (room <= r->stream_room) return 0;
    struct stream_state *grown = calloc(room, sizeof *grown);
    if (grown == NULL) return 0;
    for (uint32_t i = 0; i < r->stream_room; i++) {
        if (r->streams[i].stream == 0) continue;
        uint32_t at = slot_of(r->streams[i].stream, room);
        while (grown[at].stream != 0) at = (at + 1) & (room - 1);
        grown[at] = r->streams[i];
    }
    free(r->streams);
    r->streams = grown, r->stream_room = room;
    return 1;
}

/* Whether a stream is among the calls the server runs (running_calls) follows from its state: a call is counted
 * once the client ended its side of it (its message whole: a stream with no message is not a call) or reset it,
 * and until the server begins its answer or ends it. */
static void recount(struct h2_reader *r, struct stream_state *s) {
    int counted = s->state != PEER_OPEN && !(s->facts & ANSWERED);
    if (counted == !!(s->facts & COUNTED)) return;
    s->facts = (uint16_t)(counted ? s->facts | COUNTED : s->facts & ~COUNTED);
    r->counted += counted ? 1u : (uint32_t)-1;
    if (r->public) __atomic_add_fetch(&running_calls, counted ? 1 : -1, __ATOMIC_RELAXED);
}

static void set_state(struct h2_reader *r, struct stream_state *s, uint32_t state) {
    if (s->state == PEER_OPEN) r->peer_open--;
    s->state = (uint16_t)state;
    if (s->state == PEER_OPEN) r->peer_open++;
    recount(r, s);
}

static void table_put(struct h2_reader *r, uint32_t stream, uint32_t state) {
    struct stream_state *known = table_find(r, stream);
    if (known != NULL) {
        set_state(r, known, state);
        return;
    }
    if (stream == 0 || !make_room(r)) return; /* out of memory: its RST_STREAM becomes a WINDOW_UPDATE */
    uint32_t at = slot_of(stream, r->stream_room);
    while (r->streams[at].stream != 0) at = (at + 1) & (r->stream_room - 1);
    r->streams[at] = (struct stream_state){stream, 0, 0, NULL, r->server_initial, r->client_initial, 0};
    r->stream_count++;
    set_state(r, &r->streams[at], state);
}

/* Removes the stream (backward-shift deletion: no tombstones to fill the table). */
static void table_drop(struct h2_reader *r, struct stream_state *gone) {
    free(gone->check);
    gone->check = NULL;
    gone->facts |= ANSWERED; /* counted no more */
    set_state(r, gone, RUNNING);
    uint32_t mask = r->stream_room - 1, hole = (uint32_t)(gone - r->streams);
    for (uint32_t i = (hole + 1) & mask; r->streams[i].stream != 0; i = (i + 1) & mask) {
        uint32_t home = slot_of(r->streams[i].stream, r->stream_room);
        if (((i - home) & mask) >= ((i - hole) & mask)) { /* its home is at or before the hole: move it back */
            r->streams[hole] = r->streams[i];
            hole = i;
        }
    }
    r->streams[hole].stream = 0;
    r->stream_count--;
}

/* The server ended the stream: it leaves the table, and the backlog if nobody waited for it. */
static void server_ended(struct h2_reader *r, uint32_t stream) {
    struct stream_state *known = table_find(r, stream);
    if (known == NULL) return;
    if (known->state == ORPHAN && !(known->facts & ANSWERED)) count_orphans(r, -1);
    table_drop(r, known);
}

/* The server began its answer on the stream (its HEADERS, not ending it): the call has run. What is left is writing
 * the answer, which flow control lets a client hold up (a window of 0): the call leaves the waiting bound and the
 * backlog. */
static void server_answered(struct h2_reader *r, uint32_t stream) {
    struct stream_state *known = table_find(r, stream);
    if (known == NULL || (known->facts & ANSWERED)) return;
    if (known->state == ORPHAN) count_orphans(r, -1);
    known->facts |= ANSWERED;
    recount(r, known);
}

static uint32_t stream_of(const uint8_t *id) {
    return ((uint32_t)(id[0] & 0x7f) << 24) | ((uint32_t)id[1] << 16) | ((uint32_t)id[2] << 8) | id[3];
}

static uint32_t length_of(const uint8_t *head) {
    return ((uint32_t)head[0] << 16) | ((uint32_t)head[1] << 8) | head[2];
}

/* The bytes a read returned, as one sequence over its buffers. */
struct received {
    const struct iovec *iov;
    size_t parts;
    size_t total;
};

/* The byte at position at of what was received. */
static uint8_t *byte_at(const struct received *in, size_t at) {
    for (size_t p = 0; p < in->parts; p++) {
        if (at < in->iov[p].iov_len) return (uint8_t *)in->iov[p].iov_base + at;
        at -= in->iov[p].iov_len;
    }
    return NULL;
}

/* A frame a client that reaches gRPC directly must never have gRPC read: one that would make gRPC reset a call it
 * runs, or end the connection and with it every call (RFC 7540's connection errors that a frame header shows).
 * Stream rules: DATA or HEADERS after the client ended its side, HEADERS on an open stream other than its
 * trailers; HEADERS reopening a closed stream, on an even one or on stream 0; DATA on stream 0, or a reset or
 * WINDOW_UPDATE on a stream never opened.
 * Framing rules: a frame longer than the server allows (its SETTINGS_MAX_FRAME_SIZE); anything but a CONTINUATION
 * of the same stream inside a header block, or a CONTINUATION outside one; a PUSH_PROMISE (only servers push);
 * control frames on a stream, or of the wrong size; DATA past a window the server announced. */
static int breaks_a_call(const struct h2_reader *r, uint8_t type, uint8_t flags, uint32_t length, uint32_t stream,
                         const struct stream_state *known) {
    int idle = stream > r->last_stream && known == NULL;
    if (length > r->max_frame) return 1;
    if (r->continuing != 0) return type != 9 || stream != r->continuing;
    switch (type) {
    case 0: /* and within the windows the server announced */
        if (length > r->conn_recv || (known != NULL && length > known->recv)) return 1;
        return stream == 0 || (known != NULL ? known->state != PEER_OPEN : idle);
    case 1: /* opens a stream, or ends an open one (trailers); never padded: gRPC ends a connection that pads one */
        if (flags & 0x8) return 1;
        if (known == NULL && (r->stream_count >= STREAMS_PER_CONNECTION || r->peer_open >= OPEN_PER_CONNECTION)) return 1;
        return stream == 0 || (known != NULL ? known->state != PEER_OPEN || !(flags & 0x1) : !idle || !(stream & 1));
    case 2: return stream == 0 || length != 5;
    case 3: return stream == 0 || length != 4 || idle;
    case 4: return stream != 0 || (flags & 0x1 ? length != 0 : length % 6 != 0 || length > CONTROL_CAP);
    case 5: return 1;
    case 6: return stream != 0 || length != 8;
    case 7: return stream != 0 || length < 8;
    case 8: return length != 4 || (stream != 0 && idle);
    case 9: return 1; /* outside a header block */
    default: return 0; /* an unknown type: ignored, as RFC 7540 asks */
    }
}

/* The flags each frame type defines (RFC 7540 section 6): DATA END_STREAM and PADDED; HEADERS END_STREAM, END_HEADERS,
 * PADDED and PRIORITY; SETTINGS and PING ACK; CONTINUATION END_HEADERS; none for the others. */
static const uint8_t DEFINED_FLAGS[10] = {0x09, 0x2d, 0, 0, 0x01, 0x0c, 0x01, 0, 0, 0x04};

/* A frame's header as gRPC is handed it on a public port: flags its type does not define cleared, in place (RFC 7540
 * has them ignored; tritonserver 2.51's gRPC ends the connection for one on a SETTINGS, PING or WINDOW_UPDATE, and
 * with it every call it runs). A frame of an unknown type is ignored whatever its flags. */
static void canonical_flags(struct h2_reader *r, const struct received *in, size_t at) {
    if (r->head[3] > 9) return;
    uint8_t kept = r->head[4] & DEFINED_FLAGS[r->head[3]];
    if (kept == r->head[4]) return;
    r->head[4] = kept;
    *byte_at(in, at + 4) = kept;
}

/* How the payload of a HEADERS (type 1) or CONTINUATION (9) frame is read: its header block fragment walked. */
static void block_begins(struct h2_reader *r, uint8_t type, uint8_t flags) {
    r->block = type == 1 || type == 9;
    r->padded = type == 1 && (flags & 0x8);
    r->lead = type == 1 ? (r->padded ? 1u : 0u) + ((flags & 0x20) ? 5u : 0u) : 0u;
    r->trail = 0;
    if (type == 1) hpack_walk_start(&r->walk);
}

/* How much of a frame's payload a public port reads before gRPC reads its header: all of a SETTINGS,
 * WINDOW_UPDATE, PRIORITY or PING (a control frame), a padded frame's pad length, a HEADERS frame's priority. */
static uint32_t held_payload(uint8_t type, uint8_t flags, uint32_t length) {
    if (type == 4 || type == 8 || type == 2 || type == 6) return length <= CONTROL_CAP ? length : 0;
    uint32_t lead = ((type == 0 || type == 1) && (flags & 0x8) ? 1u : 0u) + (type == 1 && (flags & 0x20) ? 5u : 0u);
    return lead < length ? lead : length;
}

static uint32_t u32_at(const struct received *in, size_t at) {
    return ((uint32_t)*byte_at(in, at) << 24) | ((uint32_t)*byte_at(in, at + 1) << 16) |
           ((uint32_t)*byte_at(in, at + 2) << 8) | *byte_at(in, at + 3);
}

/* What the first payload bytes show (at p, read before gRPC reads the frame): padding as long as the frame or longer,
 * or a stream that depends on itself (RFC 7540 5.3.1), which gRPC would answer by resetting it or ending the
 * connection. */
static int lead_breaks(uint8_t type, uint8_t flags, uint32_t length, uint32_t stream, const struct received *in,
                       size_t p) {
    if (type == 2) return (u32_at(in, p) & 0x7fffffff) == stream;
    if (type != 0 && type != 1) return 0;
    uint32_t padded = flags & 0x8 ? 1 : 0, priority = type == 1 && (flags & 0x20) ? 5 : 0;
    if (padded + priority > length) return 1;
    if (padded && (uint32_t)*byte_at(in, p) + 1 + priority > length) return 1;
    return priority && (u32_at(in, p + padded) & 0x7fffffff) == stream;
}

/* A client's WINDOW_UPDATE (its payload at p): an increment of 0, or one past 2^31-1 of the server's window, makes
 * gRPC reset the stream or end the connection. Applied where it passes. */
static int window_update_breaks(struct h2_reader *r, uint32_t stream, const struct received *in, size_t p) {
    int64_t increment = u32_at(in, p) & 0x7fffffff;
    if (increment == 0) return 1;
    if (stream == 0) {
        if (r->conn_send + increment > WINDOW_MAX) return 1;
        r->conn_send += increment;
        return 0;
    }
    struct stream_state *known = table_find(r, stream);
    if (known == NULL) return 0; /* a stream the server ended: ignored */
    if (known->send + increment > WINDOW_MAX) return 1;
    known->send += increment;
    return 0;
}

/* A client's reset, as gRPC will read it: on a stream still open, a padded DATA of 4 bytes that the connection's
 * window must hold; on another, a WINDOW_UPDATE of 1 that the server's window for the stream must take. Applied
 * where it passes. */
static int reset_breaks(struct h2_reader *r, struct stream_state *known) {
    if (known != NULL && known->state == PEER_OPEN) {
        if (r->conn_recv < 4 || known->recv < 4) return 1;
        r->conn_recv -= 4, known->recv -= 4;
    } else if (known != NULL) {
        if (known->send + 1 > WINDOW_MAX) return 1;
        known->send += 1;
    }
    return 0;
}

/* A client's SETTINGS (length bytes at p): a value RFC 7540 forbids, or an initial window that takes one of the
 * server's stream windows past 2^31-1, ends the connection. Applied where it passes. */
static int settings_break(struct h2_reader *r, const struct received *in, size_t p, uint32_t length) {
    for (size_t e = p; e + 6 <= p + length; e += 6) {
        uint32_t id = ((uint32_t)*byte_at(in, e) << 8) | *byte_at(in, e + 1), value = u32_at(in, e + 2);
        if ((id == 2 && value > 1) || (id == 5 && (value < 16384 || value > 0xffffff))) return 1;
        if (id == 1 && value != 4096) r->table_resized = 1; /* a block of the server's may have to say so first */
        if (id != 4) continue;
        if (value > WINDOW_MAX) return 1;
        int64_t change = (int64_t)value - r->client_initial;
        for (uint32_t i = 0; i < r->stream_room; i++) {
            if (r->streams[i].stream != 0 && r->streams[i].send + change > WINDOW_MAX) return 1;
        }
        for (uint32_t i = 0; i < r->stream_room; i++) r->streams[i].send += change;
        r->client_initial = value;
    }
    return 0;
}

#define BLOCK_BROKEN SIZE_MAX         /* the frames after a HEADERS are not its CONTINUATIONs: they are cut on their own */
#define BLOCK_TOO_LONG (SIZE_MAX - 1) /* past BLOCK_CAP */

/* The bytes of the header block whose HEADERS frame starts at position at (its frames up to END_HEADERS); 0 where
 * more must come (*need: how many bytes at least), or BLOCK_BROKEN, BLOCK_TOO_LONG. */
static size_t block_extent(const struct received *in, size_t at, size_t *need) {
    uint32_t stream = 0;
    for (size_t p = at;;) {
        if (in->total - p < 9) {
            *need = 9 - (in->total - p);
            return 0;
        }
        uint8_t head[9];
        for (int k = 0; k < 9; k++) head[k] = *byte_at(in, p + (size_t)k);
        if (p == at) stream = stream_of(head + 5);
        else if (head[3] != 9 || stream_of(head + 5) != stream) return BLOCK_BROKEN;
        uint32_t length = length_of(head);
        if (p - at + 9 + length > BLOCK_CAP) return BLOCK_TOO_LONG;
        if (in->total - p - 9 < length) {
            *need = length - (in->total - p - 9);
            return 0;
        }
        p += 9 + length;
        if (head[4] & 0x4) return p - at;
    }
}

/* Where the last frame of the whole header block at position at (extent bytes) starts. */
static size_t last_frame(const struct received *in, size_t at, size_t extent) {
    size_t last = at;
    for (size_t p = at; p < at + extent; p += 9 + (u32_at(in, p) >> 8)) last = p;
    return last;
}

/* The whole header block at position at (extent bytes) checked against the server's HPACK table, as gRPC will
 * decode it: -1 where gRPC would end the connection (grpc_headers.c: hpack_check), or where it cannot be read
 * (padding past its frame). */
static int block_breaks(struct h2_reader *r, const struct received *in, size_t at, size_t extent) {
    uint8_t *fragments = malloc(extent);
    if (fragments == NULL) return 1;
    size_t n = 0;
    int bad = 0;
    for (size_t p = at; p < at + extent && !bad;) {
        uint8_t type = *byte_at(in, p + 3), flags = *byte_at(in, p + 4);
        uint32_t length = u32_at(in, p) >> 8; /* the 24-bit length (the header is whole) */
        uint32_t lead = 0, trail = 0;
        if (type == 1) {
            lead = (flags & 0x8 ? 1u : 0u) + (flags & 0x20 ? 5u : 0u);
            trail = flags & 0x8 && length > 0 ? *byte_at(in, p + 9) : 0;
        }
        bad = lead + trail > length;
        for (uint32_t k = lead; !bad && k + trail < length; k++) fragments[n++] = *byte_at(in, p + 9 + k);
        p += 9 + length;
    }
    uint8_t named = HPACK_PATH_NONE;
    bad = bad || hpack_check(&r->table, fragments, n, &named) < 0;
    r->block_path = named & HPACK_PATH_MASK;
    r->block_own = (named & HPACK_OWN_CALL_ID) != 0;
    free(fragments);
    return bad;
}

/* ---- 2c. bounds: a new call refused before gRPC has it ---- */

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

/* Room for n more bytes of replies (under r->lock); 0 when out of memory. */
static int reply_room(struct h2_reader *r, size_t n) {
    if (r->reply_count + n <= r->reply_room) return 1;
    size_t room = r->reply_room ? r->reply_room * 2 : 512;
    while (room < r->reply_count + n) room *= 2;
    uint8_t *grown = realloc(r->reply, room);
    if (grown == NULL) return 0;
    r->reply = grown, r->reply_room = room;
    return 1;
}

static uint8_t *put_literal(uint8_t *at, const char *name, const char *value) {
    size_t n = strlen(name), v = strlen(value);
    *at++ = 0x00, *at++ = (uint8_t)n; /* without indexing, a new name: no table changes */
    memcpy(at, name, n), at += n;
    *at++ = (uint8_t)v;
    memcpy(at, value, v);
    return at + v;
}

/* A refusal without a header block, for a client that announced an HPACK table size of its own (the server's
 * blocks must then say so first): a RST_STREAM with the code, and the connection's window back. */
static void reset_refusal(struct h2_reader *r, uint32_t stream, uint8_t code, uint32_t unread) {
    if (r->reply_count > REPLY_CAP || !reply_room(r, 26)) return;
    uint8_t frames[26] = {0, 0, 4, 3, 0, (uint8_t)(stream >> 24), (uint8_t)(stream >> 16), (uint8_t)(stream >> 8),
                          (uint8_t)stream, 0, 0, 0, code, 0, 0, 4, 8, 0, 0, 0, 0, 0, (uint8_t)(unread >> 24),
                          (uint8_t)(unread >> 16), (uint8_t)(unread >> 8), (uint8_t)unread};
    size_t n = unread > 0 ? 26 : 13;
    memcpy(r->reply + r->reply_count, frames, n);
    r->reply_count += n;
    refused_calls++;
}

/* The client's answer to a refused call: a trailers-only HEADERS (static HPACK only), UNAVAILABLE with the reason
 * and gRPC's retry hint (a stream refused while streaming is off: UNIMPLEMENTED, no hint); and a WINDOW_UPDATE
 * giving back the connection's window for the bytes the server never read. Out of memory: the answer is dropped
 * (the client's deadline ends the call). */
static void queue_refusal(struct h2_reader *r, uint32_t stream, const char *why, const char *code, uint32_t unread) {
    int retry = strcmp(code, "14") == 0; /* UNAVAILABLE: a bound, worth a retry */
    if (r->table_resized) { /* the server's next header block must begin with a size update: no block of the guard's */
        reset_refusal(r, stream, retry ? 7 : 1, unread); /* REFUSED_STREAM (UNAVAILABLE at the client), PROTOCOL_ERROR */
        return;
    }
    uint8_t block[256], *at = block;
    *at++ = 0x88;                                      /* :status 200 */
    *at++ = 0x0f, *at++ = 0x10, *at++ = 16;            /* content-type (static 31), without indexing */
    memcpy(at, "application/grpc", 16), at += 16;
    at = put_literal(at, "grpc-status", code);         /* UNIMPLEMENTED, INVALID_ARGUMENT or UNAVAILABLE */
    at = put_literal(at, "grpc-message", why);         /* under 127 bytes: one length byte */
    if (retry) at = put_literal(at, "grpc-retry-pushback-ms", "1000");
    size_t length = (size_t)(at - block);
    if (r->reply_count > REPLY_CAP || !reply_room(r, 9 + length + 13)) return; /* not reading its answers */
    uint8_t *f = r->reply + r->reply_count;
    uint8_t head[9] = {0, 0, (uint8_t)length, 1, 0x5, (uint8_t)(stream >> 24), (uint8_t)(stream >> 16),
                       (uint8_t)(stream >> 8), (uint8_t)stream}; /* END_STREAM | END_HEADERS */
    memcpy(f, head, 9), memcpy(f + 9, block, length);
    r->reply_count += 9 + length;
    if (unread > 0) {
        uint8_t credit[13] = {0, 0, 4, 8, 0, 0, 0, 0, 0, (uint8_t)(unread >> 24), (uint8_t)(unread >> 16),
                              (uint8_t)(unread >> 8), (uint8_t)unread};
        memcpy(r->reply + r->reply_count, credit, 13);
        r->reply_count += 13;
    }
    refused_calls++;
    if (refused_calls <= 10 || refused_calls % 1000 == 0)
        say("triton_guard: refused a new gRPC call (%s; %lu refused so far)\n", why, refused_calls);
}

/* A new ModelInfer call's first DATA frame (the header whole at position at of in): REFUSED when a bound says so
 * and the frame can carry the refusal (REFUSAL_BYTES or longer). Other calls never are: health, metadata and admin
 * calls are answered without waiting. A ModelStreamInfer stream's first DATA frame that carries bytes, while
 * streaming is off: REFUSED, or where the frame cannot carry the refusal, REFUSAL_CUTS (the connection is cut before
 * gRPC reads it; its calls end as a hung-up client's do). Its header becomes a RST_STREAM's, its payload the reset's
 * code (CANCEL) and the header of a frame of a type the server ignores that covers the rest: the server reads no
 * byte of the message, and the stream it opened at the headers ends with no request run. */
static int refused_call(struct h2_reader *r, const struct received *in, size_t at, struct stream_state *known,
                        uint32_t stream, uint32_t length) {
    if (known == NULL || known->state != PEER_OPEN || (known->facts & HAD_DATA)) return NOT_REFUSED;
    int unserved = (known->facts & STREAMING) && !streaming_served, own = (known->facts & OWN_ID) != 0;
    if (!(known->facts & INFERENCE) && !unserved) return NOT_REFUSED;
    if (length == 0) return NOT_REFUSED; /* no byte of a message yet: the next frame is the first */
    known->facts |= HAD_DATA;
    const char *why = unserved ? STREAMING_WHY : own ? OWN_ID_WHY : oversized(in, at, length, r->head[4]);
    const char *code = unserved ? "12" : own ? "3" : why != NULL ? "8" : "14";
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

/* A client's PING (whole, at position at): answered by the guard and read by gRPC as a frame of a type it ignores.
 * gRPC counts the pings of a client that sends them more often than every 5 minutes while it sends nothing, and
 * ends the connection ("too_many_pings") after two: that cancels the calls it runs (tritonserver 2.51's crash).
 * 1 (cut) where the client is not reading the answers. */
static int ping_answered(struct h2_reader *r, const struct received *in, size_t at) {
    if (r->reply_count > REPLY_CAP || !reply_room(r, 17)) return 1;
    uint8_t *ack = r->reply + r->reply_count;
    static const uint8_t head[9] = {0, 0, 8, 6, 0x1, 0, 0, 0, 0};
    memcpy(ack, head, 9);
    for (int k = 0; k < 8; k++) ack[9 + k] = *byte_at(in, at + 9 + k);
    r->reply_count += 17;
    *byte_at(in, at + 3) = UNKNOWN_TYPE;
    return 0;
}

/* Whether a client's DATA frame (header in head) is on a ModelStreamInfer stream: read whole before gRPC reads any of
 * it, so that its messages are checked first (under r->lock). */
static int streaming_data(const struct h2_reader *r, const uint8_t *head) {
    if (!r->public || head[3] != 0 || !streaming_served) return 0; /* not served: refused at its first byte */
    const struct stream_state *known = table_find(r, stream_of(head + 5));
    return known != NULL && (known->facts & STREAMING);
}

/* Whether a client's DATA frame (header in head) is the first with bytes of a ModelInfer call: its payload's lead
 * (pad length, then the message's 5-byte prefix) is read before gRPC reads its header, so that the message's length
 * is known before gRPC holds any of it (under r->lock). */
static int first_call_data(const struct h2_reader *r, const uint8_t *head) {
    if (!r->public || head[3] != 0 || length_of(head) == 0) return 0;
    const struct stream_state *known = table_find(r, stream_of(head + 5));
    return known != NULL && (known->facts & INFERENCE) && !(known->facts & HAD_DATA) && known->state == PEER_OPEN;
}

/* The payload bytes of a call's first DATA frame that hold the message's prefix (at most the frame). */
static uint32_t message_lead(const uint8_t *head) {
    uint32_t lead = ((head[4] & 0x8) ? 1u : 0u) + 5u, length = length_of(head);
    return lead < length ? lead : length;
}

/* A ModelStreamInfer stream's DATA frame, whole at position at: 1 (cut) where a message it carries (or ends) is one
 * gRPC could not decode, which would end the stream and cancel its requests still running (grpc_messages.c). The
 * frame is then never read: gRPC holds the message's start, and the stream ends as the connection's do. */
static int stream_data_breaks(struct stream_state *known, const struct received *in, size_t at) {
    uint8_t flags = *byte_at(in, at + 4);
    uint32_t length = u32_at(in, at) >> 8;
    size_t from = at + 9, to = at + 9 + length;
    if (flags & 0x8) { /* padded: the pad length first, the padding last (lead_breaks checked they fit) */
        to -= *byte_at(in, from);
        from++;
    }
    if (known->check == NULL) {
        known->check = malloc(sizeof *known->check);
        if (known->check == NULL) return 1;
        message_check_start(known->check);
    }
    size_t offset = 0;
    for (size_t p = 0; p < in->parts && offset < to; offset += in->iov[p].iov_len, p++) {
        size_t start = from > offset ? from - offset : 0, stop = to - offset;
        if (start >= in->iov[p].iov_len) continue;
        if (stop > in->iov[p].iov_len) stop = in->iov[p].iov_len;
        if (message_check_feed(known->check, (const uint8_t *)in->iov[p].iov_base + start, stop - start) < 0) return 1;
    }
    return 0;
}

/* The id of the ModelInfer call whose header block was begun in this read (2d), to be handed out after the block;
 * 0 where there is no table, the block was not read whole here, this read has given IDS_PER_READ ids, or memory ran
 * out. */
static uint64_t id_after_block(struct h2_reader *r, uint32_t stream) {
    if (r->block_after == 0 || r->insert_count >= IDS_PER_READ) return 0;
    uint64_t id = call_id_next();
    if (id == 0) return 0;
    if (r->insert_count == r->insert_room) {
        size_t room = r->insert_room ? r->insert_room * 2 : 8;
        struct id_insert *grown = realloc(r->inserts, room * sizeof *grown);
        if (grown == NULL) return 0;
        r->inserts = grown, r->insert_room = room;
    }
    r->inserts[r->insert_count++] = (struct id_insert){r->block_after, r->block_last, stream, id};
    return id;
}

/* A whole frame header from the peer, its first byte at position at: a RST_STREAM is rewritten in place (type and
 * flags; its payload as it passes), HEADERS and DATA open and half-close streams. On a public port, a frame that
 * would break a call is cut (r->cut) and a header block is walked. */
static void peer_header(struct h2_reader *r, const struct received *in, size_t at) {
    static const uint8_t rst_length[3] = {0, 0, 4};
    uint8_t type = r->head[3], flags = r->head[4];
    uint32_t stream = stream_of(r->head + 5);
    r->replace = NULL;
    r->replace_at = 0;
    r->replace_count = 4;
    r->payload_left = length_of(r->head);
    r->payload_at = 0;
    struct stream_state *known = table_find(r, stream);
    if (r->public) {
        int breaks = breaks_a_call(r, type, flags, r->payload_left, stream, known);
        if (!breaks) breaks = lead_breaks(type, flags, r->payload_left, stream, in, at + 9);
        if (!breaks && type == 8) breaks = window_update_breaks(r, stream, in, at + 9);
        if (!breaks && type == 4 && !(flags & 0x1)) breaks = settings_break(r, in, at + 9, r->payload_left);
        if (!breaks && type == 3) breaks = reset_breaks(r, known);
        if (!breaks && type == 6 && !(flags & 0x1)) breaks = ping_answered(r, in, at);
        if (!breaks && type == 0 && known != NULL && (known->facts & STREAMING) && streaming_served)
            breaks = stream_data_breaks(known, in, at);
        if (!breaks && type == 4 && !(flags & 0x1)) breaks = ++r->settings_seen > SETTINGS_CAP;
        if (breaks) {
            r->cut = at;
            return;
        }
        if (type == 7) *byte_at(in, at + 3) = UNKNOWN_TYPE; /* a GOAWAY: the client hangs up when it goes */
        if (type == 4 && (flags & 0x1)) settings_acked(r); /* gRPC holds the client to them once it reads this */
        int refused = type == 0 ? refused_call(r, in, at, known, stream, r->payload_left) : NOT_REFUSED;
        if (refused == REFUSAL_CUTS) {
            r->cut = at;
            return;
        }
        if (refused == REFUSED) {
            block_begins(r, type, 0);
            return;
        }
        if (type == 0) { /* within the windows (breaks_a_call): it spends them */
            r->conn_recv -= r->payload_left;
            if (known != NULL) known->recv -= r->payload_left;
        }
        block_begins(r, type, flags);
        if (type == 1 || type == 9) {
            r->continuing = (flags & 0x4) ? 0 : stream; /* END_HEADERS ends the block */
            r->block_stream = stream;
        }
    }
    if (type == 3 && memcmp(r->head, rst_length, 3) == 0) {
        int open = known != NULL && known->state == PEER_OPEN;
        r->replace = open ? EMPTY_PADDED : WINDOW_UPDATE_ONE;
        *byte_at(in, at + 3) = open ? 0x0 : 0x8;  /* DATA : WINDOW_UPDATE */
        *byte_at(in, at + 4) = open ? 0x9 : 0x0;  /* END_STREAM | PADDED : no flags */
        if (known != NULL && known->state != ORPHAN) {
            set_state(r, known, ORPHAN);
            if (!(known->facts & ANSWERED)) count_orphans(r, 1);
            r->cancelled_ns = front_now_ns();
            call_id_cancelled(known->call); /* reset by its client: the model answers it unrun */
        }
    } else if (stream != 0 && (type == 0 || type == 1)) {
        int ends = flags & 0x1; /* END_STREAM */
        if (known == NULL && type == 1) {
            table_put(r, stream, ends ? RUNNING : PEER_OPEN);
            struct stream_state *opened = table_find(r, stream);
            if (opened != NULL && r->block_path == HPACK_PATH_INFER) opened->facts |= INFERENCE;
            if (opened != NULL && r->block_path == HPACK_PATH_STREAM) opened->facts |= STREAMING;
            if (opened != NULL && r->public && r->block_own) opened->facts |= OWN_ID;
            else if (opened != NULL && r->public && r->block_path == HPACK_PATH_INFER) opened->call = id_after_block(r, stream);
            if (stream > r->last_stream) r->last_stream = stream;
        } else if (known != NULL && ends && known->state == PEER_OPEN) {
            set_state(r, known, RUNNING);
        }
    }
}

/* One payload byte of a header-block frame: its pad length, priority, padding, or a fragment byte walked. */
static void block_byte(struct h2_reader *r, uint8_t *byte) {
    uint32_t p = r->payload_at++, length = length_of(r->head);
    if (r->padded && p == 0) {
        r->trail = *byte;
    } else if (p >= r->lead && p + r->trail < length) {
        *byte = hpack_walk_byte(&r->walk, *byte);
    }
}

/* Walks the bytes of one read from position from on (the held bytes of the last one first), rewriting RST_STREAM
 * frames; returns how many bytes end in a frame header not yet whole (held back for the next read). Where a frame
 * is cut (r->cut), the walk stops at its start. */
static size_t filter(struct h2_reader *r, const struct received *in, size_t from) {
    size_t i = from, header_start = from, hold = 0;
    r->head_at = r->head_at == 9 ? 9 : 0; /* a partial header was held back: it is read again from its start */
    r->cut = SIZE_MAX;
    r->insert_count = 0;
    pthread_mutex_lock(&r->lock);
    while (i < in->total) {
        if (r->preface_left > 0) {
            size_t skip = in->total - i < r->preface_left ? in->total - i : r->preface_left;
            r->preface_left -= (uint32_t)skip;
            i += skip;
        } else if (r->head_at < 9) {
            if (r->head_at == 0) header_start = i;
            r->head[r->head_at++] = *byte_at(in, i++);
            if (r->head_at == 9 && r->public) canonical_flags(r, in, header_start);
            uint32_t held = r->head_at == 9 && r->public ? held_payload(r->head[3], r->head[4], length_of(r->head)) : 0;
            if (r->head_at == 9 && streaming_data(r, r->head)) held = length_of(r->head); /* its messages checked */
            if (r->head_at == 9 && first_call_data(r, r->head)) held = message_lead(r->head); /* its length read */
            if (held > 0 && in->total - i < held) { /* read again whole, with what of its payload is read first */
                hold = in->total - header_start;
                r->head_at = 0;
                break;
            }
            if (r->head_at == 9 && r->public && r->head[3] == 1 && r->continuing == 0) { /* a header block begins */
                size_t need = 0, extent = block_extent(in, header_start, &need);
                if (extent == 0) { /* read again whole, with all its frames */
                    hold = in->total - header_start;
                    r->head_at = 0;
                    break;
                }
                if (extent == BLOCK_TOO_LONG || (extent != BLOCK_BROKEN && block_breaks(r, in, header_start, extent))) {
                    r->cut = header_start, r->head_at = 0, r->payload_left = 0;
                    break;
                }
                r->block_after = extent == BLOCK_BROKEN ? 0 : header_start + extent;
                r->block_last = extent == BLOCK_BROKEN ? 0 : last_frame(in, header_start, extent);
                if (extent == BLOCK_BROKEN) r->block_own = 0;
            }
            if (r->head_at == 9) {
                peer_header(r, in, header_start);
                if (r->cut != SIZE_MAX) { /* gRPC's reading ends at the frame before: a frame boundary */
                    r->head_at = 0, r->payload_left = 0;
                    break;
                }
                if (r->payload_left == 0) r->head_at = 0;
            }
        } else if (r->replace != NULL) {
            *byte_at(in, i++) = r->replace[r->replace_at++];
            if (r->replace_at == r->replace_count) r->replace = NULL; /* the rest of the payload passes as it is */
            if (--r->payload_left == 0) r->head_at = 0;
        } else if (r->block) {
            block_byte(r, byte_at(in, i++));
            if (--r->payload_left == 0) r->head_at = 0;
        } else {
            size_t skip = in->total - i < r->payload_left ? in->total - i : r->payload_left;
            r->payload_left -= (uint32_t)skip;
            i += skip;
            if (r->payload_left == 0) r->head_at = 0;
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (r->cut != SIZE_MAX) return 0;
    if (hold > 0) return hold;
    return r->head_at < 9 ? r->head_at : 0;
}

static int watched(int fd) {
    return fd >= 0 && fd < MAX_FDS && readers[fd] != NULL;
}

/* Copies n bytes into the sequence of buffers from its start. */
static void put_front(const struct iovec *iov, size_t parts, const uint8_t *bytes, size_t n) {
    for (size_t p = 0; p < parts && n > 0; p++) {
        size_t take = iov[p].iov_len < n ? iov[p].iov_len : n;
        memcpy(iov[p].iov_base, bytes, take);
        bytes += take, n -= take;
    }
}

/* The buffers past their first `skip` bytes, into shifted (at most MAX_PARTS of them); returns how many. */
#define MAX_PARTS 64
static size_t shift_iov(const struct iovec *iov, size_t parts, size_t skip, struct iovec *shifted) {
    size_t count = 0;
    for (size_t p = 0; p < parts && count < MAX_PARTS; p++) {
        if (skip >= iov[p].iov_len) {
            skip -= iov[p].iov_len;
            continue;
        }
        shifted[count].iov_base = (uint8_t *)iov[p].iov_base + skip;
        shifted[count++].iov_len = iov[p].iov_len - skip;
        skip = 0;
    }
    return count;
}

/* Copies n bytes into the sequence of buffers from offset on. */
static void put_at(const struct iovec *iov, size_t parts, size_t offset, const uint8_t *bytes, size_t n) {
    for (size_t p = 0; p < parts && n > 0; p++) {
        if (offset >= iov[p].iov_len) {
            offset -= iov[p].iov_len;
            continue;
        }
        size_t take = iov[p].iov_len - offset < n ? iov[p].iov_len - offset : n;
        memcpy((uint8_t *)iov[p].iov_base + offset, bytes, take);
        bytes += take, n -= take, offset = 0;
    }
}

/* ---- 2d. each call's id after its header block ---- */

_Static_assert(9 + 3 + sizeof CALL_ID_NAME - 1 + CALL_ID_HEX == ID_FRAME, "an id's frame");

static int hold_room(struct h2_reader *r, size_t n);

/* How many of this read's ids go out with the bytes handed out, [0, end): those whose block ends within them. */
static size_t ids_within(const struct h2_reader *r, size_t end) {
    size_t k = 0;
    while (k < r->insert_count && r->inserts[k].after <= end) k++;
    return k;
}

/* A CONTINUATION ending the block (END_HEADERS) with one field: x-edge-call, the id (without indexing, a new name). */
static void id_frame(uint8_t *at, uint32_t stream, uint64_t id) {
    const uint8_t head[9] = {0, 0, ID_FRAME - 9, 9, 0x4, (uint8_t)((stream >> 24) & 0x7f), (uint8_t)(stream >> 16),
                             (uint8_t)(stream >> 8), (uint8_t)stream};
    memcpy(at, head, 9);
    at[9] = 0x00, at[10] = sizeof CALL_ID_NAME - 1;
    memcpy(at + 11, CALL_ID_NAME, sizeof CALL_ID_NAME - 1);
    at[10 + sizeof CALL_ID_NAME] = CALL_ID_HEX;
    call_id_hex(id, (char *)at + 11 + sizeof CALL_ID_NAME);
}

/* Bytes [from, end) of in, each of the first k ids' frames after its block, into out (each block's last frame has
 * lost END_HEADERS in in already); how many. */
static size_t with_id_frames(const struct h2_reader *r, const struct received *in, size_t from, size_t end, size_t k,
                             uint8_t *out) {
    size_t n = 0, at = from;
    for (size_t j = 0; j <= k; j++) {
        size_t stop = j < k ? r->inserts[j].after : end;
        for (size_t p = 0, base = 0; p < in->parts && at < stop; base += in->iov[p].iov_len, p++) {
            if (at >= base + in->iov[p].iov_len) continue;
            size_t take = (stop < base + in->iov[p].iov_len ? stop : base + in->iov[p].iov_len) - at;
            memcpy(out + n, (const uint8_t *)in->iov[p].iov_base + (at - base), take);
            n += take, at += take;
        }
        if (j < k) id_frame(out + n, r->inserts[j].stream, r->inserts[j].id), n += ID_FRAME;
    }
    return n;
}

/* The bytes [0, end) of a read handed out (in the caller's buffers, in), with this read's ids after their blocks:
 * what passes the caller's room waits in ready, handed out first at the next read. Returns how many bytes the read
 * returns now. Out of memory: handed out without the ids (those calls are computed if cancelled, as before). */
static size_t handed(struct h2_reader *r, const struct received *in, size_t end, const struct iovec *iov, size_t parts,
                     size_t room) {
    size_t k = ids_within(r, end);
    if (k == 0) return end;
    size_t from = r->inserts[0].after, n = end + k * ID_FRAME, over = n > room ? n - room : 0;
    uint8_t *tail = malloc(n - from);
    if (tail == NULL || (over > 0 && !hold_room(r, over))) {
        free(tail);
        return end;
    }
    for (size_t j = 0; j < k; j++) *byte_at(in, r->inserts[j].last + 4) &= (uint8_t)~0x4;
    size_t t = with_id_frames(r, in, from, end, k, tail), fit = room - from;
    put_at(iov, parts, from, tail, t < fit ? t : fit);
    if (t > fit) {
        memcpy(r->ready, tail + fit, t - fit);
        r->ready_count = (uint32_t)(t - fit), r->ready_at = 0;
    }
    free(tail);
    return n - over;
}

/* ---- a public port: what a client that hangs up or breaks the protocol leaves is never cancelled ---- */

/* Frames to hand gRPC as if the gone peer had sent them (kept under r->lock). Out of memory: dropped. */
static void synth_frame(struct h2_reader *r, uint8_t type, uint8_t flags, uint32_t stream, uint32_t increment) {
    size_t size = type == 8 ? 13 : 9;
    if (r->synth_count + size > r->synth_room) {
        size_t room = r->synth_room ? r->synth_room * 2 : 256;
        while (room < r->synth_count + size) room *= 2;
        uint8_t *grown = realloc(r->synth, room);
        if (grown == NULL) return;
        r->synth = grown, r->synth_room = room;
    }
    uint8_t *f = r->synth + r->synth_count;
    uint8_t length = (uint8_t)(size - 9);
    uint8_t head[13] = {0, 0, length, type, flags, (uint8_t)(stream >> 24), (uint8_t)(stream >> 16),
                        (uint8_t)(stream >> 8), (uint8_t)stream, (uint8_t)(increment >> 24),
                        (uint8_t)(increment >> 16), (uint8_t)(increment >> 8), (uint8_t)increment};
    memcpy(f, head, size);
    r->synth_count += size;
}

/* The gone peer's windows opened for the server (WINDOW_UPDATE frames as if it had sent them): answers a client held
 * up (a window of 0, never opened) are written, dropped, and their calls end, so that the connection can. */
static void open_windows(struct h2_reader *r) {
    for (uint32_t i = 0; i < r->stream_room; i++) {
        struct stream_state *s = &r->streams[i];
        if (s->stream == 0 || s->send >= DEFAULT_WINDOW) continue;
        synth_frame(r, 8, 0, s->stream, (uint32_t)(DEFAULT_WINDOW - s->send));
        s->send = DEFAULT_WINDOW;
    }
    if (r->conn_send < DEFAULT_WINDOW) {
        synth_frame(r, 8, 0, 0, (uint32_t)(DEFAULT_WINDOW - r->conn_send));
        r->conn_send = DEFAULT_WINDOW;
    }
}

/* Whether the server still runs a call of this connection (a stream the peer ended its side of, or reset). */
static int runs_calls(const struct h2_reader *r) {
    for (uint32_t i = 0; i < r->stream_room; i++) {
        if (r->streams[i].stream != 0 && r->streams[i].state != PEER_OPEN) return 1;
    }
    return 0;
}

/* The peer is gone (hung up, or cut for a frame that would break a call): gRPC reads nothing more from it, and
 * at a frame boundary each stream the peer left open is ended as if it had ended it (an empty DATA with
 * END_STREAM), so the server finishes it. The connection ends for gRPC once it runs no call. */
static void peer_gone(struct h2_reader *r) {
    pthread_mutex_lock(&r->lock);
    /* ready holds decided bytes up to where the guard has read (an id's frame may be among them): handed out first */
    int boundary = r->preface_left == 0 && r->head_at < 9;
    uint32_t block_stream = r->continuing ? r->continuing : (r->head_at == 9 && r->block ? r->block_stream : 0);
    if (block_stream != 0) { /* gRPC is inside a header block: it may read nothing but its end */
        if (boundary && hpack_walk_between(&r->walk)) {
            synth_frame(r, 9, 0x4, block_stream, 0); /* an empty CONTINUATION with END_HEADERS */
        } else { /* it ends mid-representation: no call was made of it, and no frame may follow */
            struct stream_state *known = table_find(r, block_stream);
            if (known != NULL) table_drop(r, known);
            boundary = 0;
        }
        r->continuing = 0;
    }
    r->gone = 1;
    r->held_count = 0;
    for (uint32_t i = 0; i < r->stream_room; i++) { /* nobody waits for what the server has not answered */
        if (r->streams[i].stream != 0) call_id_cancelled(r->streams[i].call);
    }
    for (uint32_t i = 0; boundary && i < r->stream_room; i++) {
        if (r->streams[i].stream == 0 || r->streams[i].state != PEER_OPEN) continue;
        synth_frame(r, 0, 0x1, r->streams[i].stream, 0);
        set_state(r, &r->streams[i], RUNNING);
    }
    if (boundary && r->public) open_windows(r);
    pthread_mutex_unlock(&r->lock);
}

/* A read of a gone peer's connection: its frames, then EAGAIN while the server runs a call of it, then its end. */
static size_t hand_ready(struct h2_reader *r, const struct iovec *iov, size_t parts, size_t room);

static ssize_t gone_read(int fd, struct h2_reader *r, const struct iovec *iov, size_t parts, size_t room) {
    if (r->ready_count > 0 && room > 0) { /* decided before the peer went: first */
        size_t n = hand_ready(r, iov, parts, room);
        shutdown(fd, SHUT_RD); /* read again for what follows */
        return (ssize_t)n;
    }
    pthread_mutex_lock(&r->lock);
    ssize_t result;
    if ((r->synth_count > 0 || r->ready_count > 0) && room == 0) { /* nowhere to put them: read again */
        shutdown(fd, SHUT_RD);
        errno = EAGAIN;
        result = -1;
    } else if (r->synth_count > 0) {
        size_t n = r->synth_count < room ? r->synth_count : room;
        put_front(iov, parts, r->synth, n);
        memmove(r->synth, r->synth + n, r->synth_count - n);
        r->synth_count -= n;
        result = (ssize_t)n;
        if (r->synth_count > 0) shutdown(fd, SHUT_RD);
    } else if (runs_calls(r)) {
        errno = EAGAIN;
        result = -1;
    } else {
        result = 0;
    }
    pthread_mutex_unlock(&r->lock);
    return result;
}

/* gRPC waits for the socket to say it is readable (edge-triggered): shutting down its reading side says so. */
static void wake(int fd, struct h2_reader *r) {
    pthread_mutex_lock(&r->lock);
    int due = r->synth_count > 0 || r->ready_count > 0 || !runs_calls(r);
    pthread_mutex_unlock(&r->lock);
    if (due) shutdown(fd, SHUT_RD);
}

static unsigned long cuts = 0;

/* A frame gRPC must never read was cut (r->cut): the connection counts as hung up, and the log says so. */
static void cut_connection(int fd, struct h2_reader *r) {
    cuts++;
    if (cuts <= 10 || cuts % 1000 == 0)
        say("triton_guard: a gRPC client sent a frame that would have reset a running call or ended the connection "
            "(type %u on stream %u): nothing more of it is read, and the connection closes once its calls end (%lu so "
            "far)\n", r->head[3], stream_of(r->head + 5), cuts);
    peer_gone(r);
    wake(fd, r);
}

/* A read that found the peer gone (0) or failed (an error other than one to wait on): hidden from gRPC on a public
 * port while the server runs a call of the connection. */
static int hang_up(ssize_t got, int error, struct h2_reader *r) {
    if (!r->public || got > 0 || (got < 0 && (error == EAGAIN || error == EWOULDBLOCK || error == EINTR))) return 0;
    pthread_mutex_lock(&r->lock);
    int running = r->stream_count > 0;
    pthread_mutex_unlock(&r->lock);
    if (running) peer_gone(r);
    return running;
}

typedef ssize_t (*reader_fn)(int fd, struct iovec *iov, size_t parts, void *context);
static void reply_now(int fd, struct h2_reader *r);

/* Hands out up to room bytes of the decided header bytes waiting; returns how many. */
static size_t hand_ready(struct h2_reader *r, const struct iovec *iov, size_t parts, size_t room) {
    size_t n = r->ready_count < room ? r->ready_count : room;
    put_front(iov, parts, r->ready + r->ready_at, n);
    r->ready_at += (uint32_t)n;
    r->ready_count -= (uint32_t)n;
    if (r->ready_count == 0) r->ready_at = 0;
    if (r->ready_count == 0 && r->held_count == 0 && r->hold_room > KEEP_ROOM) { /* a large frame was held: let go */
        uint8_t *held = realloc(r->held, HOLD_CAP), *ready = realloc(r->ready, HOLD_CAP);
        if (held != NULL) r->held = held;
        if (ready != NULL) r->ready = ready;
        if (held != NULL && ready != NULL) {
            r->hold_room = HOLD_CAP;
            front_release(r->budgeted);
            r->budgeted = 0;
            malloc_trim(0); /* the large rooms' memory goes back to the system */
        }
    }
    return n;
}

/* The held header completed from what the socket has now (never waiting), decided, and moved to ready: 1 done;
 * 0 with *result set when the socket has nothing (EAGAIN), ended (0) or failed. */
/* Room for n held bytes (and as many ready ones): 0 past HOLD_CAP or out of memory. */
static int hold_room(struct h2_reader *r, size_t n) {
    if (n <= r->hold_room) return 1;
    if (n > HOLD_CAP && (!r->public || n > 9 + (size_t)r->max_frame)) return 0; /* a stream's DATA: a whole frame */
    size_t base = r->hold_room > HOLD_CAP ? r->hold_room : HOLD_CAP, extra = n > base ? 2 * (n - base) : 0;
    if (extra > 0 && !front_hold(extra)) { /* the front holds as much for clients as it may */
        r->starved = 1;
        return 0;
    }
    uint8_t *held = realloc(r->held, n);
    if (held != NULL) r->held = held;
    uint8_t *ready = held != NULL ? realloc(r->ready, n) : NULL;
    if (ready != NULL) r->ready = ready;
    if (held == NULL || ready == NULL) {
        front_release(extra);
        return 0;
    }
    r->budgeted += extra;
    r->hold_room = (uint32_t)n;
    return 1;
}

/* Bytes still to come of the held unit: a frame header, or on a public port a control frame read whole. */
static size_t held_need(struct h2_reader *r) {
    if (r->held_count < 9) return 9 - r->held_count;
    if (r->public && r->held[3] == 1 && r->continuing == 0) { /* a header block: its frames up to END_HEADERS */
        struct iovec whole = {r->held, r->held_count};
        struct received in = {&whole, 1, r->held_count};
        size_t need = 0;
        block_extent(&in, 0, &need);
        return need;
    }
    size_t whole = 9 + (r->public ? held_payload(r->held[3], r->held[4], length_of(r->held)) : 0);
    pthread_mutex_lock(&r->lock);
    if (streaming_data(r, r->held)) whole = 9 + length_of(r->held);
    if (first_call_data(r, r->held)) whole = 9 + message_lead(r->held);
    pthread_mutex_unlock(&r->lock);
    return whole > r->held_count ? whole - r->held_count : 0;
}

static int complete_held(int fd, struct h2_reader *r, ssize_t *result) {
    int flags = fcntl(fd, F_GETFL), blocking = flags >= 0 && !(flags & O_NONBLOCK); /* a blocking reader waits */
    ssize_t got = 1;
    for (size_t need = held_need(r); need > 0 && got > 0; need = held_need(r)) {
        if (!hold_room(r, r->held_count + need)) break; /* past HOLD_CAP: what is held is decided as it is */
        got = real_recv(fd, r->held + r->held_count, need, blocking ? 0 : MSG_DONTWAIT);
        if (got > 0) r->held_count += (uint32_t)got;
        if (!blocking && got > 0 && (size_t)got < need) break; /* the rest has not come yet */
    }
    if (r->starved) { /* over the front's memory budget: nothing more of it is read */
        r->held_count = 0;
        cut_connection(fd, r);
        errno = EAGAIN;
        *result = -1;
        return 0;
    }
    if (got <= 0) {
        int error = errno;
        if (hang_up(got, error, r)) {
            *result = gone_read(fd, r, &(struct iovec){r->held, 0}, 1, 0);
            wake(fd, r);
            return 0;
        }
        errno = error;
        *result = got;
        return 0;
    }
    struct iovec whole = {r->held, r->held_count};
    struct received in = {&whole, 1, r->held_count};
    size_t keep = filter(r, &in, 0);
    if (keep && r->cut == SIZE_MAX) { /* still not whole: nothing more has arrived */
        errno = EAGAIN;
        *result = -1;
        return 0;
    }
    /* decided: all of it, or where a frame gRPC must never read starts, what comes before it (the frames gRPC's
     * state was followed through: a header block the guard let begin is then ended as the peer's going ends it) */
    size_t decided = r->cut != SIZE_MAX ? r->cut : r->held_count;
    size_t k = ids_within(r, decided);
    if (k > 0 && hold_room(r, decided + k * ID_FRAME)) { /* the unit decided was a call's header block */
        struct iovec unit = {r->held, decided}; /* held may have moved */
        struct received before = {&unit, 1, decided};
        for (size_t j = 0; j < k; j++) r->held[r->inserts[j].last + 4] &= (uint8_t)~0x4;
        r->ready_count = (uint32_t)with_id_frames(r, &before, 0, decided, k, r->ready);
    } else {
        memcpy(r->ready, r->held, decided);
        r->ready_count = (uint32_t)decided;
    }
    r->held_count = 0;
    if (r->cut != SIZE_MAX) { /* the unit completed holds one gRPC must never read */
        cut_connection(fd, r);
        if (r->ready_count > 0) return 1;
        errno = EAGAIN;
        *result = -1;
        return 0;
    }
    return 1;
}

/* One read on a watched connection. Every frame header handed out is decided on whole: a header a read ends in
 * is held back (at most 8 bytes) and read again with what follows it, so a split frame never waits for its rest;
 * where the caller's buffer is too small for it, the header's decided bytes are handed out over several reads.
 * Nothing whole is ever kept from the caller while the socket is quiet. */
static ssize_t read_guarded(int fd, const struct iovec *iov, size_t parts, reader_fn read_more, void *context) {
    struct h2_reader *r = readers[fd];
    size_t room = 0;
    for (size_t p = 0; p < parts; p++) room += iov[p].iov_len;
    if (room == 0) return read_more(fd, (struct iovec *)iov, parts, context);
    if (r->gone) return gone_read(fd, r, iov, parts, room);
    if (r->ready_count > 0) return (ssize_t)hand_ready(r, iov, parts, room);
    size_t held = r->held_count;
    if (room <= held) { /* no room past the held bytes: complete the header from the socket, or say EAGAIN */
        ssize_t result = 0;
        if (!complete_held(fd, r, &result)) return result;
        return (ssize_t)hand_ready(r, iov, parts, room);
    }
    put_front(iov, parts, r->held, held);
    struct iovec shifted[MAX_PARTS];
    size_t count = shift_iov(iov, parts, held, shifted);
    ssize_t got = read_more(fd, shifted, count, context);
    int error = errno;
    if (hang_up(got, error, r)) return gone_read(fd, r, iov, parts, room);
    if (got == 0) { /* the peer is gone: a partial header means nothing */
        r->held_count = 0;
        return 0;
    }
    if (got < 0) {
        errno = error;
        return -1; /* the held bytes stay held */
    }
    size_t total = held + (size_t)got;
    struct received in = {iov, parts, total};
    r->held_count = 0;
    size_t keep = filter(r, &in, 0);
    if (r->cut != SIZE_MAX) { /* gRPC reads up to the frame it must never see, and nothing more of this peer */
        size_t before = handed(r, &in, r->cut, iov, parts, room);
        cut_connection(fd, r);
        if (before > 0) return (ssize_t)before;
        return gone_read(fd, r, iov, parts, room);
    }
    if (!hold_room(r, keep)) { /* out of memory: this client's connection is not read further */
        size_t before = handed(r, &in, total - keep, iov, parts, room);
        peer_gone(r);
        wake(fd, r);
        if (before > 0) return (ssize_t)before;
        return gone_read(fd, r, iov, parts, room);
    }
    for (size_t k = 0; k < keep; k++) r->held[k] = *byte_at(&in, total - keep + k);
    r->held_count = (uint32_t)keep;
    if (total > keep) return (ssize_t)handed(r, &in, total - keep, iov, parts, room);
    ssize_t result = 0; /* all of it a header's start: what completes it may be there already */
    if (!complete_held(fd, r, &result)) return result;
    return (ssize_t)hand_ready(r, iov, parts, room);
}

/* The read, then the answers of the calls it refused sent. */
static ssize_t guarded_read(int fd, const struct iovec *iov, size_t parts, reader_fn read_more, void *context) {
    ssize_t got = read_guarded(fd, iov, parts, read_more, context);
    int error = errno;
    if (watched(fd)) reply_now(fd, readers[fd]);
    errno = error;
    return got;
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
    resolve();
    if (front_watched(fd)) return (flags & MSG_PEEK) ? (errno = EAGAIN, -1) : front_read(fd, message->msg_iov, message->msg_iovlen);
    if (!watched(fd) || (flags & (MSG_PEEK | MSG_ERRQUEUE))) return real_recvmsg(fd, message, flags); /* not the stream */
    /* bytes the guard hands out without reading the socket come with no control message: gRPC then reads again
     * until EAGAIN (with no TCP_INQ message it assumes more may be queued) instead of waiting for an edge */
    struct message_read call = {message, flags, message->msg_controllen};
    message->msg_controllen = 0;
    ssize_t got = guarded_read(fd, message->msg_iov, message->msg_iovlen, read_message, &call);
    /* Bytes left for the next read (a call's id that did not fit): the socket's own TCP_INQ would say nothing is
     * queued, and gRPC would wait for an edge that no client byte may bring (a client waiting for its answer). */
    if (watched(fd) && readers[fd]->ready_count > 0) message->msg_controllen = 0;
    return got;
}

ssize_t recv(int fd, void *buffer, size_t length, int flags) {
    resolve();
    if (front_watched(fd)) {
        struct iovec one = {buffer, length};
        return (flags & MSG_PEEK) ? (errno = EAGAIN, -1) : front_read(fd, &one, 1);
    }
    if (!watched(fd) || (flags & (MSG_PEEK | MSG_ERRQUEUE))) return real_recv(fd, buffer, length, flags);
    struct iovec one = {buffer, length};
    struct message_read call = {NULL, flags, 0};
    return guarded_read(fd, &one, 1, read_message, &call);
}

ssize_t read(int fd, void *buffer, size_t length) {
    resolve();
    struct iovec one = {buffer, length};
    if (front_watched(fd)) return front_read(fd, &one, 1);
    if (!watched(fd)) return real_read(fd, buffer, length);
    return guarded_read(fd, &one, 1, read_iov, NULL);
}

ssize_t readv(int fd, const struct iovec *iov, int parts) {
    resolve();
    if (front_watched(fd) && parts >= 0) return front_read(fd, iov, (size_t)parts);
    if (!watched(fd) || parts < 0) return real_readv(fd, iov, parts);
    return guarded_read(fd, iov, (size_t)parts, read_iov, NULL);
}

/* FIONREAD on a front connection: what a read hands out now, not what the socket holds. */
int ioctl(int fd, unsigned long request, ...) {
    resolve();
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

/* A SETTINGS entry of the server's: the longest frame it allows is the largest it announced (never less than RFC
 * 7540's 16384), the HPACK table and the initial window likewise, so that nothing the server accepts is cut. */
static void server_setting(struct h2_reader *r, const uint8_t *entry) {
    uint32_t id = ((uint32_t)entry[0] << 8) | entry[1];
    uint32_t value = ((uint32_t)entry[2] << 24) | ((uint32_t)entry[3] << 16) | ((uint32_t)entry[4] << 8) | entry[5];
    if (id == 1) r->announcing[0] = value;
    if (id == 4) r->announcing[1] = value;
    if (id == 5) r->announcing[2] = value;
}

/* A SETTINGS frame of the server's, written whole: waits for the client's acknowledgment. Past 8 unacknowledged, the
 * later ones are never applied (the guard then holds the client to less than gRPC would). */
static void settings_sent(struct h2_reader *r) {
    if (r->unacked_count < 8) memcpy(r->unacked[r->unacked_count++], r->announcing, sizeof r->announcing);
    memset(r->announcing, 0xff, sizeof r->announcing);
}

/* The client acknowledged the server's oldest unacknowledged SETTINGS: from now on gRPC holds it to them. */
static void settings_acked(struct h2_reader *r) {
    if (r->unacked_count == 0) return;
    uint32_t table = r->unacked[0][0], initial = r->unacked[0][1], frame = r->unacked[0][2];
    memmove(r->unacked[0], r->unacked[1], sizeof r->unacked[0] * (size_t)--r->unacked_count);
    if (frame != UINT32_MAX && frame > r->max_frame && frame <= 0xffffff) r->max_frame = frame;
    if (table != UINT32_MAX && table > r->table.limit) r->table.limit = table;
    if (initial != UINT32_MAX && initial > r->server_initial && initial <= WINDOW_MAX) { /* every stream's grows */
        for (uint32_t i = 0; i < r->stream_room; i++) r->streams[i].recv += (int64_t)initial - r->server_initial;
        r->server_initial = initial;
    }
}

/* A WINDOW_UPDATE of the server's: what it lets the client send more of. */
static void server_window(struct h2_reader *r, uint32_t stream, const uint8_t *bytes) {
    int64_t increment = (((uint32_t)bytes[0] & 0x7f) << 24) | ((uint32_t)bytes[1] << 16) |
                        ((uint32_t)bytes[2] << 8) | bytes[3];
    struct stream_state *known = stream ? table_find(r, stream) : NULL;
    if (stream == 0) r->conn_recv += increment;
    else if (known != NULL) known->recv += increment;
}

/* A whole frame header of the server's. Counting (before the bytes are sent, counted once however often a short
 * write sends them again): its DATA spends the client's windows. Committing (once sent): a stream it ends leaves
 * the table; to a gone peer, its DATA is credited back. */
static void server_header(struct h2_reader *r, const struct out_parser *o, int counting) {
    uint8_t type = o->head[3], flags = o->head[4];
    uint32_t stream = stream_of(o->head + 5), length = length_of(o->head);
    if (counting) {
        if (type != 0 || o->offset <= r->credited) return; /* counted already, before a short write */
        struct stream_state *known = table_find(r, stream);
        r->conn_send -= length;
        if (known != NULL) known->send -= length;
        return;
    }
    if (stream != 0 && (type == 3 || ((type == 0 || type == 1) && (flags & 0x1)))) server_ended(r, stream);
    else if (stream != 0 && type == 1) server_answered(r, stream);
    if (r->gone && type == 0 && length > 0) { /* nobody reads it: credit it back, or the call stalls */
        synth_frame(r, 8, 0, stream, length);
        synth_frame(r, 8, 0, 0, length);
    }
}

/* The server's frames in total bytes of in, followed from o. Counting, the window changes they make are applied
 * before they are sent: a client that answers them at once is never cut for a window the guard had not yet seen. */
static void follow_server(struct h2_reader *r, struct out_parser *o, const struct received *in, size_t total,
                          int counting) {
    for (size_t i = 0; i < total;) {
        if (o->head_at < 9) {
            o->head[o->head_at++] = *byte_at(in, i++);
            o->offset++;
            if (o->head_at < 9) continue;
            server_header(r, o, counting);
            o->type = o->head[3], o->stream = stream_of(o->head + 5), o->payload_left = length_of(o->head);
            o->settings = o->type == 4 && !(o->head[4] & 0x1), o->setting_at = 0, o->window_at = 0;
            if (o->type == 1 || o->type == 9) o->in_block = !(o->head[4] & 0x4); /* until END_HEADERS */
            int fresh = counting && o->offset > r->credited; /* this frame is counted now, once */
            if (o->settings && fresh) memset(r->announcing, 0xff, sizeof r->announcing);
            if (o->settings && fresh && o->payload_left == 0) settings_sent(r);
            if (o->payload_left == 0) o->head_at = 0;
        } else if (o->settings || (o->type == 8 && o->window_at < 4)) {
            uint8_t byte = *byte_at(in, i++);
            o->offset++;
            int counted = counting && o->offset > r->credited;
            if (o->settings) {
                o->setting[o->setting_at++] = byte;
                if (o->setting_at == 6 && counted) server_setting(r, o->setting);
                if (o->setting_at == 6) o->setting_at = 0;
            } else {
                o->window[o->window_at++] = byte;
                if (o->window_at == 4 && counted) server_window(r, o->stream, o->window);
            }
            if (--o->payload_left == 0 && o->settings && counted) settings_sent(r); /* whole: awaits its ACK */
            if (o->payload_left == 0) o->head_at = 0;
        } else {
            size_t skip = total - i < o->payload_left ? total - i : o->payload_left;
            o->payload_left -= (uint32_t)skip;
            o->offset += skip;
            i += skip;
            if (o->payload_left == 0) o->head_at = 0;
        }
    }
}

/* Before a write to a client of a public port: the window changes of all it may send, counted. */
static void server_writes(int fd, const struct iovec *iov, size_t parts) {
    struct h2_reader *r = readers[fd];
    size_t total = 0;
    for (size_t p = 0; p < parts; p++) total += iov[p].iov_len;
    struct received in = {iov, parts, total};
    pthread_mutex_lock(&r->lock);
    struct out_parser ahead = r->out;
    follow_server(r, &ahead, &in, total, 1);
    if (ahead.offset > r->credited) r->credited = ahead.offset;
    pthread_mutex_unlock(&r->lock);
}

/* The server's own frames as written: a stream it ends (END_STREAM, or its RST_STREAM) leaves the table. */
static void server_wrote(int fd, const struct iovec *iov, size_t parts, size_t total) {
    struct h2_reader *r = readers[fd];
    struct received in = {iov, parts, total};
    pthread_mutex_lock(&r->lock);
    follow_server(r, &r->out, &in, total, 0);
    pthread_mutex_unlock(&r->lock);
}

/* A write on a watched connection: what the server wrote, followed. To a gone peer of a public port nothing is sent
 * (it would fail, and gRPC would end the connection and its calls): the bytes count as written. A write that
 * fails because the peer is gone makes it gone, while the server runs a call of the connection. */
static ssize_t guarded_write(int fd, const struct iovec *iov, size_t parts, ssize_t sent) {
    struct h2_reader *r = readers[fd];
    size_t total = 0;
    for (size_t p = 0; p < parts; p++) total += iov[p].iov_len;
    if (sent < 0 && !r->gone) hang_up(sent, errno, r);
    if (r->gone) sent = (ssize_t)total;
    if (sent > 0) server_wrote(fd, iov, parts, (size_t)sent);
    if (r->gone) wake(fd, r);
    return sent;
}

static int gone(int fd) {
    return watched(fd) && readers[fd]->gone;
}

static void before_writing(int fd, const struct iovec *iov, size_t parts) {
    if (watched(fd) && readers[fd]->public) server_writes(fd, iov, parts);
}

/* The guard's replies sent as far as the socket takes them now, only between the server's frames (r->wlock
 * held). Returns 0 while some of them is sent and the rest is not: the server may not write before it is. */
static int send_replies(int fd, struct h2_reader *r) {
    int error = errno;
    pthread_mutex_lock(&r->lock);
    if (r->gone) r->reply_count = 0, r->mid_reply = 0;
    int between = r->out.head_at == 0 && !r->out.in_block;
    if (r->reply_count > 0 && (between || r->mid_reply)) {
        ssize_t n = real_send(fd, r->reply, r->reply_count, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            memmove(r->reply, r->reply + n, r->reply_count - (size_t)n);
            r->reply_count -= (size_t)n;
            r->mid_reply = r->reply_count > 0;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            r->reply_count = 0, r->mid_reply = 0; /* the server's own write finds the error */
        }
    }
    int clear = !r->mid_reply;
    pthread_mutex_unlock(&r->lock);
    errno = error;
    return clear;
}

/* A public connection's writes hold r->wlock; the guard's replies go first where they can. NULL: not one. */
static struct h2_reader *writing(int fd) {
    if (!watched(fd) || !readers[fd]->public) return NULL;
    struct h2_reader *r = readers[fd];
    pthread_mutex_lock(&r->wlock);
    return r;
}

/* After the server's write: replies that came meanwhile go too, and the connection is the next writer's. */
static ssize_t written(int fd, struct h2_reader *r, ssize_t sent) {
    if (r == NULL) return sent;
    int error = errno;
    send_replies(fd, r);
    pthread_mutex_unlock(&r->wlock);
    errno = error;
    return sent;
}

/* The server may not write now (a reply is half sent): it waits for the socket, as for a full one. */
static int held_back(int fd, struct h2_reader *r) {
    if (r == NULL || send_replies(fd, r)) return 0;
    pthread_mutex_unlock(&r->wlock);
    errno = EAGAIN;
    return 1;
}

/* After a read that queued replies: sent now if the server is between frames (else its next write sends them). */
static void reply_now(int fd, struct h2_reader *r) {
    if (!r->public || r->reply_count == 0) return;
    pthread_mutex_lock(&r->wlock);
    send_replies(fd, r);
    pthread_mutex_unlock(&r->wlock);
}

ssize_t sendmsg(int fd, const struct msghdr *message, int flags) {
    resolve();
    struct h2_reader *r = writing(fd);
    if (held_back(fd, r)) return -1;
    before_writing(fd, message->msg_iov, message->msg_iovlen);
    ssize_t sent = gone(fd) ? 0 : real_sendmsg(fd, message, flags);
    if (watched(fd)) sent = guarded_write(fd, message->msg_iov, message->msg_iovlen, sent);
    if (sent > 0) front_wrote(fd, message->msg_iov, message->msg_iovlen, (size_t)sent);
    return written(fd, r, sent);
}

ssize_t send(int fd, const void *buffer, size_t length, int flags) {
    resolve();
    struct iovec one = {(void *)buffer, length};
    struct h2_reader *r = writing(fd);
    if (held_back(fd, r)) return -1;
    before_writing(fd, &one, 1);
    ssize_t sent = gone(fd) ? 0 : real_send(fd, buffer, length, flags);
    if (watched(fd)) sent = guarded_write(fd, &one, 1, sent);
    if (sent > 0) front_wrote(fd, &one, 1, (size_t)sent);
    return written(fd, r, sent);
}

ssize_t write(int fd, const void *buffer, size_t length) {
    resolve();
    struct iovec one = {(void *)buffer, length};
    struct h2_reader *r = writing(fd);
    if (held_back(fd, r)) return -1;
    before_writing(fd, &one, 1);
    ssize_t sent = gone(fd) ? 0 : real_write(fd, buffer, length);
    if (watched(fd)) sent = guarded_write(fd, &one, 1, sent);
    if (sent > 0) front_wrote(fd, &one, 1, (size_t)sent);
    return written(fd, r, sent);
}

ssize_t writev(int fd, const struct iovec *iov, int parts) {
    resolve();
    struct h2_reader *r = parts >= 0 ? writing(fd) : NULL;
    if (held_back(fd, r)) return -1;
    if (parts >= 0) before_writing(fd, iov, (size_t)parts);
    ssize_t sent = gone(fd) ? 0 : real_writev(fd, iov, parts);
    if (watched(fd) && parts >= 0) sent = guarded_write(fd, iov, (size_t)parts, sent);
    if (sent > 0 && parts >= 0) front_wrote(fd, iov, (size_t)parts, (size_t)sent);
    return written(fd, r, sent);
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
