/* h2_frame_checks: what a client's frame on a public port would do to tritonserver 2.51's gRPC, decided before gRPC
 * reads the frame. A frame that would make gRPC reset a call it runs or end the connection (breaking a stream's state,
 * the framing, flow control as both sides announced it, or HPACK) is never read. What gRPC accepts was found from its
 * own behaviour (tests/functional/test_front_grpc_differential.py), not from the RFC: flags a type does not define are
 * cleared, a padded HEADERS is cut, header blocks are checked whole against the server's table (grpc_headers.c), a
 * ModelStreamInfer stream's messages as its protobuf reads them (grpc_messages.c). A client's PING is answered here. */
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
#include "grpc_headers.h"
#include "grpc_messages.h"
#include "h2_admission.h"
#include "h2_frame_checks.h"
#include "h2_own_frames.h"
#include "h2_streams.h"

/* A frame a client that reaches gRPC directly must never have gRPC read: one that would make gRPC reset a call it
 * runs, or end the connection and with it every call (RFC 7540's connection errors that a frame header shows).
 * Stream rules: DATA or HEADERS after the client ended its side, HEADERS on an open stream other than its
 * trailers; HEADERS reopening a closed stream, on an even one or on stream 0; DATA on stream 0, or a reset or
 * WINDOW_UPDATE on a stream never opened.
 * Framing rules: a frame longer than the server allows (its SETTINGS_MAX_FRAME_SIZE); anything but a CONTINUATION
 * of the same stream inside a header block, or a CONTINUATION outside one; a PUSH_PROMISE (only servers push);
 * control frames on a stream, or of the wrong size; DATA past a window the server announced. */
int breaks_a_call(const struct h2_reader *r, uint8_t type, uint8_t flags, uint32_t length, uint32_t stream,
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
void canonical_flags(struct h2_reader *r, const struct received *in, size_t at) {
    if (r->head[3] > 9) return;
    uint8_t kept = r->head[4] & DEFINED_FLAGS[r->head[3]];
    if (kept == r->head[4]) return;
    r->head[4] = kept;
    *byte_at(in, at + 4) = kept;
}

/* How much of a frame's payload a public port reads before gRPC reads its header: all of a SETTINGS,
 * WINDOW_UPDATE, PRIORITY or PING (a control frame), a padded frame's pad length, a HEADERS frame's priority. */
uint32_t held_payload(uint8_t type, uint8_t flags, uint32_t length) {
    if (type == 4 || type == 8 || type == 2 || type == 6) return length <= CONTROL_CAP ? length : 0;
    uint32_t lead = ((type == 0 || type == 1) && (flags & 0x8) ? 1u : 0u) + (type == 1 && (flags & 0x20) ? 5u : 0u);
    return lead < length ? lead : length;
}

/* What the first payload bytes show (at p, read before gRPC reads the frame): padding as long as the frame or longer,
 * or a stream that depends on itself (RFC 7540 5.3.1), which gRPC would answer by resetting it or ending the
 * connection. */
int lead_breaks(uint8_t type, uint8_t flags, uint32_t length, uint32_t stream, const struct received *in,
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
int window_update_breaks(struct h2_reader *r, uint32_t stream, const struct received *in, size_t p) {
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
int reset_breaks(struct h2_reader *r, struct stream_state *known) {
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
int settings_break(struct h2_reader *r, const struct received *in, size_t p, uint32_t length) {
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

/* The bytes of the header block whose HEADERS frame starts at position at (its frames up to END_HEADERS); 0 where
 * more must come (*need: how many bytes at least), or BLOCK_BROKEN, BLOCK_TOO_LONG. */
size_t block_extent(const struct received *in, size_t at, size_t *need) {
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
size_t last_frame(const struct received *in, size_t at, size_t extent) {
    size_t last = at;
    for (size_t p = at; p < at + extent; p += 9 + (u32_at(in, p) >> 8)) last = p;
    return last;
}

/* The whole header block at position at (extent bytes) checked against the server's HPACK table, as gRPC will
 * decode it: -1 where gRPC would end the connection (grpc_headers.c: hpack_check), or where it cannot be read
 * (padding past its frame). */
int block_breaks(struct h2_reader *r, const struct received *in, size_t at, size_t extent) {
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

/* A client's PING (whole, at position at): answered by the guard and read by gRPC as a frame of a type it ignores.
 * gRPC counts the pings of a client that sends them more often than every 5 minutes while it sends nothing, and
 * ends the connection ("too_many_pings") after two: that cancels the calls it runs (tritonserver 2.51's crash).
 * 1 (cut) where the client is not reading the answers. */
int ping_answered(struct h2_reader *r, const struct received *in, size_t at) {
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
int streaming_data(const struct h2_reader *r, const uint8_t *head) {
    if (!r->public || head[3] != 0 || !streaming_served) return 0; /* not served: refused at its first byte */
    const struct stream_state *known = table_find(r, stream_of(head + 5));
    return known != NULL && (known->facts & STREAMING);
}

/* Whether a client's DATA frame (header in head) is the first with bytes of a ModelInfer call: its payload's lead
 * (pad length, then the message's 5-byte prefix) is read before gRPC reads its header, so that the message's length
 * is known before gRPC holds any of it (under r->lock). */
int first_call_data(const struct h2_reader *r, const uint8_t *head) {
    if (!r->public || head[3] != 0 || length_of(head) == 0) return 0;
    const struct stream_state *known = table_find(r, stream_of(head + 5));
    return known != NULL && (known->facts & INFERENCE) && !(known->facts & HAD_DATA) && known->state == PEER_OPEN;
}

/* The payload bytes of a call's first DATA frame that hold the message's prefix (at most the frame). */
uint32_t message_lead(const uint8_t *head) {
    uint32_t lead = ((head[4] & 0x8) ? 1u : 0u) + 5u, length = length_of(head);
    return lead < length ? lead : length;
}

/* A ModelStreamInfer stream's DATA frame, whole at position at: 1 (cut) where a message it carries (or ends) is one
 * gRPC could not decode, which would end the stream and cancel its requests still running (grpc_messages.c). The
 * frame is then never read: gRPC holds the message's start, and the stream ends as the connection's do. */
int stream_data_breaks(struct stream_state *known, const struct received *in, size_t at) {
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
