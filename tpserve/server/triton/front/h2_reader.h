/* h2_reader: one HTTP/2 connection as the guard reads it (the peer's byte stream, its streams the server has not ended,
 * and the server's own byte stream), shared by the h2_*.c files. A connection is watched from its accept
 * (h2_streams.c: h2_watch) until it closes (h2_forget); readers[fd] is its reader. */
#ifndef H2_READER_H
#define H2_READER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "grpc_headers.h"
#include "grpc_messages.h"

#pragma GCC visibility push(hidden)

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
#define REPLY_CAP 65536   /* the guard's unsent frames for one client: past this it is not reading them (cut) */
#define REFUSAL_BYTES 13  /* a first DATA frame this long or longer can become a RST_STREAM and an ignored frame */
#define IDS_PER_READ 256  /* calls given an id in one read: the bytes added (39 each) fit a held unit's room */
#define ID_FRAME 39       /* a CONTINUATION of one field: x-edge-call, 16 hex digits */
_Static_assert(IDS_PER_READ * ID_FRAME <= BLOCK_CAP, "a read's ids fit a held unit's room");

/* A stream the peer opened and the server has not ended: still open on the peer's side (a ModelStreamInfer
 * stream), half-closed by it (a unary call, whole), or reset by it (nobody waits: an orphan the server still runs). */
enum { PEER_OPEN = 1, RUNNING = 2, ORPHAN = 3 };
/* facts: ModelInfer; its first DATA came; ModelStreamInfer; its header block carried an x-edge-call of the client's;
 * counted among the calls the server runs (running_calls: from the client's end of its side, or its reset, until the
 * server's answer begins); the server began its answer (its HEADERS: what is left is writing it, which a client that
 * never reads can hold up, and which the waiting bound does not count) */
/* ...; its message has begun (its deadline is a body's now) */
enum { INFERENCE = 1, HAD_DATA = 2, STREAMING = 4, OWN_ID = 8, COUNTED = 16, ANSWERED = 32, BEGUN = 64 };
struct stream_state {
    uint32_t stream;  /* 0: a free slot */
    uint16_t state;
    uint16_t facts;
    struct message_check *check; /* a ModelStreamInfer stream's messages, as tritonserver's protobuf reads them */
    int64_t recv;  /* public ports: what the client may still send on it (the windows the server announced) */
    int64_t send;  /* public ports: what the server may still send on it (the windows the client announced) */
    uint64_t call; /* public ports: the call's id (2d; 0: none) */
    int64_t due;   /* public ports: when its message must be whole by (h2_deadlines.c; 0: none) */
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
    /* deadlines (h2_deadlines.c): the held unit's and the earliest of its streams' (0: none), and which stream's */
    int fd;
    int64_t held_since, held_due, stream_due;
    uint32_t due_stream;
};

extern struct h2_reader *readers[MAX_FDS];

/* The bytes a read returned, as one sequence over its buffers. */
struct received {
    const struct iovec *iov;
    size_t parts;
    size_t total;
};

static inline uint32_t stream_of(const uint8_t *id) {
    return ((uint32_t)(id[0] & 0x7f) << 24) | ((uint32_t)id[1] << 16) | ((uint32_t)id[2] << 8) | id[3];
}

static inline uint32_t length_of(const uint8_t *head) {
    return ((uint32_t)head[0] << 16) | ((uint32_t)head[1] << 8) | head[2];
}

/* The byte at position at of what was received. */
static inline uint8_t *byte_at(const struct received *in, size_t at) {
    for (size_t p = 0; p < in->parts; p++) {
        if (at < in->iov[p].iov_len) return (uint8_t *)in->iov[p].iov_base + at;
        at -= in->iov[p].iov_len;
    }
    return NULL;
}

/* n bytes of what was received from position at into out (memcpy a buffer at a time). */
static inline void copy_out(const struct received *in, size_t at, uint8_t *out, size_t n) {
    for (size_t p = 0; p < in->parts && n > 0; p++) {
        if (at >= in->iov[p].iov_len) {
            at -= in->iov[p].iov_len;
            continue;
        }
        size_t take = in->iov[p].iov_len - at < n ? in->iov[p].iov_len - at : n;
        memcpy(out, (const uint8_t *)in->iov[p].iov_base + at, take);
        out += take, n -= take, at = 0;
    }
}

static inline uint32_t u32_at(const struct received *in, size_t at) {
    return ((uint32_t)*byte_at(in, at) << 24) | ((uint32_t)*byte_at(in, at + 1) << 16) |
           ((uint32_t)*byte_at(in, at + 2) << 8) | *byte_at(in, at + 3);
}

/* Copies n bytes into the sequence of buffers from its start. */
static inline void put_front(const struct iovec *iov, size_t parts, const uint8_t *bytes, size_t n) {
    for (size_t p = 0; p < parts && n > 0; p++) {
        size_t take = iov[p].iov_len < n ? iov[p].iov_len : n;
        memcpy(iov[p].iov_base, bytes, take);
        bytes += take, n -= take;
    }
}

#pragma GCC visibility pop

#endif
