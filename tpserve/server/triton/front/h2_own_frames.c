/* h2_own_frames: the frames the guard writes itself on a public port. To the client: a refused call's answer (a
 * trailers-only HEADERS of static HPACK, or a RST_STREAM where the client resized its table) and the connection's
 * window back (r->reply, sent between the server's frames: h2_writing.c). To gRPC, as if the gone peer had sent them:
 * stream ends and window credit (r->synth, h2_gone.c). After a call's header block: a CONTINUATION carrying its id
 * (call_ids.h). */
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
#include <stdio.h>

#include "bounds.h"
#include "call_ids.h"
#include "h2_own_frames.h"
#include "libc_calls.h"

unsigned long refused_calls = 0;

/* Room for n more bytes of replies (under r->lock); 0 when out of memory. */
int reply_room(struct h2_reader *r, size_t n) {
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
    if (v > 126) v = 126; /* one HPACK length byte (a 7-bit prefix): a longer reason is cut short */
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
void queue_refusal(struct h2_reader *r, uint32_t stream, const char *why, const char *code, uint32_t unread) {
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
        guard_say("triton_guard: refused a new gRPC call (%s; %lu refused so far)\n", why, refused_calls);
}

/* Frames to hand gRPC as if the gone peer had sent them (kept under r->lock). Out of memory: dropped. */
void synth_frame(struct h2_reader *r, uint8_t type, uint8_t flags, uint32_t stream, uint32_t increment) {
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
void open_windows(struct h2_reader *r) {
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

_Static_assert(9 + 3 + sizeof CALL_ID_NAME - 1 + CALL_ID_HEX == ID_FRAME, "an id's frame");

/* A CONTINUATION ending the block (END_HEADERS) with one field: x-edge-call, the id (without indexing, a new name). */
void id_frame(uint8_t *at, uint32_t stream, uint64_t id) {
    const uint8_t head[9] = {0, 0, ID_FRAME - 9, 9, 0x4, (uint8_t)((stream >> 24) & 0x7f), (uint8_t)(stream >> 16),
                             (uint8_t)(stream >> 8), (uint8_t)stream};
    memcpy(at, head, 9);
    at[9] = 0x00, at[10] = sizeof CALL_ID_NAME - 1;
    memcpy(at + 11, CALL_ID_NAME, sizeof CALL_ID_NAME - 1);
    at[10 + sizeof CALL_ID_NAME] = CALL_ID_HEX;
    call_id_hex(id, (char *)at + 11 + sizeof CALL_ID_NAME);
}
