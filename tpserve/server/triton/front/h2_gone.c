/* h2_gone: on a public port, what a client that hangs up or breaks the protocol leaves is never cancelled. gRPC reads
 * nothing more of it; the streams it left open are ended as if it had ended them and its windows opened (frames of
 * h2_own_frames.c), so the server finishes every call; the connection's end reaches gRPC only once it runs none. */
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
#include "deadlines.h"
#include "call_ids.h"
#include "grpc_headers.h"
#include "h2_deadlines.h"
#include "h2_gone.h"
#include "h2_own_frames.h"
#include "h2_streams.h"
#include "libc_calls.h"

/* Hands out up to room bytes of the decided header bytes waiting; returns how many. */
size_t hand_ready(struct h2_reader *r, const struct iovec *iov, size_t parts, size_t room) {
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
            deadlines_trim_soon(); /* the large rooms' memory goes back to the system, off the reading thread */
        }
    }
    return n;
}

/* The peer is gone (hung up, or cut for a frame that would break a call): gRPC reads nothing more from it, and
 * at a frame boundary each stream the peer left open is ended as if it had ended it (an empty DATA with
 * END_STREAM), so the server finishes it. The connection ends for gRPC once it runs no call. */
void peer_gone(struct h2_reader *r) {
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
    held_changed(r); /* nothing more of it is read: nothing is due */
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

ssize_t gone_read(int fd, struct h2_reader *r, const struct iovec *iov, size_t parts, size_t room) {
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
void wake(int fd, struct h2_reader *r) {
    pthread_mutex_lock(&r->lock);
    int due = r->synth_count > 0 || r->ready_count > 0 || !runs_calls(r);
    pthread_mutex_unlock(&r->lock);
    if (due) shutdown(fd, SHUT_RD);
}

static unsigned long cuts = 0;

/* A frame gRPC must never read was cut (r->cut): the connection counts as hung up, and the log says so. */
void cut_connection(int fd, struct h2_reader *r) {
    cuts++;
    if (cuts <= 10 || cuts % 1000 == 0)
        guard_say("triton_guard: a gRPC client sent a frame that would have reset a running call or ended the connection "
            "(type %u on stream %u): nothing more of it is read, and the connection closes once its calls end (%lu so "
            "far)\n", r->head[3], stream_of(r->head + 5), cuts);
    peer_gone(r);
    wake(fd, r);
}

/* A read that found the peer gone (0) or failed (an error other than one to wait on): hidden from gRPC on a public
 * port while the server runs a call of the connection. */
int hang_up(ssize_t got, int error, struct h2_reader *r) {
    if (!r->public || got > 0 || (got < 0 && (error == EAGAIN || error == EWOULDBLOCK || error == EINTR))) return 0;
    pthread_mutex_lock(&r->lock);
    int running = r->stream_count > 0;
    pthread_mutex_unlock(&r->lock);
    if (running) peer_gone(r);
    return running;
}
