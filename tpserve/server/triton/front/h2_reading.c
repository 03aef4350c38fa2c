/* h2_reading: a client's bytes on a watched HTTP/2 connection, as gRPC reads them. Every frame header handed to gRPC is
 * whole and decided on: one a read ends in is held back and read again with what follows it. On a port behind Envoy
 * only RST_STREAM frames are rewritten, in place and byte for byte (a stream the peer had half-closed: a WINDOW_UPDATE
 * of 1; one still open: an empty DATA ending it), so that tritonserver 2.51 never sees a call cancelled (its gRPC
 * crashes when one is, triton-inference-server/server#8034). On a public port control frames and header blocks are read
 * whole first and checked (h2_frame_checks.c), new calls may be refused (h2_admission.c), each ModelInfer call gets its
 * id in a CONTINUATION after its block (call_ids.h), and where a frame must never be read the connection is cut there
 * (h2_gone.c). */
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
#include <fcntl.h>

#include "call_ids.h"
#include "grpc_headers.h"
#include "bounds.h"
#include "h2_admission.h"
#include "h2_frame_checks.h"
#include "h2_deadlines.h"
#include "h2_gone.h"
#include "h2_own_frames.h"
#include "h2_reading.h"
#include "h2_streams.h"
#include "h2_writing.h"
#include "libc_calls.h"

static const uint8_t WINDOW_UPDATE_ONE[4] = {0, 0, 0, 1};
static const uint8_t EMPTY_PADDED[4] = {3, 0, 0, 0}; /* pad length 3, no data, 3 bytes of padding */

/* How the payload of a HEADERS (type 1) or CONTINUATION (9) frame is read: its header block fragment walked. */
static void block_begins(struct h2_reader *r, uint8_t type, uint8_t flags) {
    r->block = type == 1 || type == 9;
    r->padded = type == 1 && (flags & 0x8);
    r->lead = type == 1 ? (r->padded ? 1u : 0u) + ((flags & 0x20) ? 5u : 0u) : 0u;
    r->trail = 0;
    if (type == 1) hpack_walk_start(&r->walk);
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

/* A stream's first DATA frame with bytes (its header at position at of in): its message has begun, and is due whole by
 * a body's deadline (its length from the message's prefix, where this read has it). */
static void began(struct h2_reader *r, struct stream_state *known, const struct received *in, size_t at) {
    known->facts |= BEGUN;
    size_t pad = (r->head[4] & 0x8) ? 1 : 0, prefix = at + 9 + pad;
    int whole = r->payload_left >= pad + 5 && prefix + 5 <= in->total;
    message_begun(r, known, whole ? u32_at(in, prefix + 1) : 0);
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
            if (known != NULL && r->payload_left > 0 && !(known->facts & BEGUN)) began(r, known, in, at);
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
            if (opened != NULL && opened->state == PEER_OPEN && !(opened->facts & STREAMING))
                stream_due(r, opened, front_now_ns() + front_head_ns()); /* its message must begin */
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

/* How many of this read's ids go out with the bytes handed out, [0, end): those whose block ends within them. */
static size_t ids_within(const struct h2_reader *r, size_t end) {
    size_t k = 0;
    while (k < r->insert_count && r->inserts[k].after <= end) k++;
    return k;
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
/* Where position at of the buffers is: its part and the offset in it (at < their length). */
static void locate(const struct iovec *iov, size_t parts, size_t at, size_t *part, size_t *offset) {
    size_t p = 0;
    while (p + 1 < parts && at >= iov[p].iov_len) at -= iov[p++].iov_len;
    *part = p, *offset = at;
}

/* Bytes [src, src + n) of the buffers moved up to dst > src, from their end down (as memmove does, across parts). */
static void move_up(const struct iovec *iov, size_t parts, size_t dst, size_t src, size_t n) {
    while (n > 0) {
        size_t sp, so, dp, dof;
        locate(iov, parts, src + n - 1, &sp, &so);
        locate(iov, parts, dst + n - 1, &dp, &dof);
        size_t run = so + 1 < dof + 1 ? so + 1 : dof + 1;
        if (run > n) run = n;
        memmove((uint8_t *)iov[dp].iov_base + dof + 1 - run, (const uint8_t *)iov[sp].iov_base + so + 1 - run, run);
        n -= run;
    }
}

/* One call's id after its block, in place: the bytes after the block move up by an id's frame (those past the
 * caller's room wait in ready), its frame goes in the gap. No copy of the read's bytes elsewhere and back: a large
 * message's first read cost a call a malloc and two copies of it. 0 where this read is not that simple case. */
static size_t handed_in_place(struct h2_reader *r, const struct received *in, size_t end, const struct iovec *iov,
                              size_t parts, size_t room) {
    size_t from = r->inserts[0].after, n = end + ID_FRAME, over = n > room ? n - room : 0;
    if (over > 0 && (room < from + ID_FRAME || !hold_room(r, over))) return 0; /* the frame itself would pass it */
    *byte_at(in, r->inserts[0].last + 4) &= (uint8_t)~0x4;
    if (over > 0) {
        copy_out(in, end - over, r->ready, over);
        r->ready_count = (uint32_t)over, r->ready_at = 0;
    }
    move_up(iov, parts, from + ID_FRAME, from, end - over - from);
    uint8_t frame[ID_FRAME];
    id_frame(frame, r->inserts[0].stream, r->inserts[0].id);
    put_at(iov, parts, from, frame, ID_FRAME);
    return n - over;
}

static size_t handed(struct h2_reader *r, const struct received *in, size_t end, const struct iovec *iov, size_t parts,
                     size_t room) {
    size_t k = ids_within(r, end);
    if (k == 0) return end;
    size_t simple = k == 1 ? handed_in_place(r, in, end, iov, parts, room) : 0;
    if (simple > 0) return simple;
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
    held_changed(r); /* a large frame's room: its deadline grows with it */
    if (r->starved) { /* over the front's memory budget: nothing more of it is read */
        r->held_count = 0;
        held_changed(r);
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
    if (keep == r->held_count && r->cut == SIZE_MAX) { /* still not whole: nothing more has arrived */
        errno = EAGAIN;
        *result = -1;
        return 0;
    }
    /* decided: all of it, or where a frame gRPC must never read starts, what comes before it (the frames gRPC's
     * state was followed through: a header block the guard let begin is then ended as the peer's going ends it), or
     * the frames before one the unit ends in the start of (those were followed through: they are handed out, never
     * read again) */
    size_t decided = r->cut != SIZE_MAX ? r->cut : r->held_count - keep;
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
    if (r->cut == SIZE_MAX && keep > 0) memmove(r->held, r->held + decided, keep); /* the start of the next unit */
    r->held_count = r->cut == SIZE_MAX ? (uint32_t)keep : 0;
    held_changed(r);
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
        held_changed(r);
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
    held_changed(r);
    if (total > keep) return (ssize_t)handed(r, &in, total - keep, iov, parts, room);
    ssize_t result = 0; /* all of it a header's start: what completes it may be there already */
    if (!complete_held(fd, r, &result)) return result;
    return (ssize_t)hand_ready(r, iov, parts, room);
}

/* The read, then the answers of the calls it refused sent. */
ssize_t guarded_read(int fd, const struct iovec *iov, size_t parts, reader_fn read_more, void *context) {
    ssize_t got = read_guarded(fd, iov, parts, read_more, context);
    int error = errno;
    if (h2_watched(fd)) reply_now(fd, readers[fd]);
    errno = error;
    return got;
}
