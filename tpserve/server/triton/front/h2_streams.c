/* h2_streams: one HTTP/2 connection's streams as the guard follows them (h2_reader.h): the table of the peer's streams
 * the server has not ended, and which of them count among the calls the server runs (bounds.h); a connection's
 * reader made when it is accepted and given back when it closes. */
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

#include "bounds.h"
#include "deadlines.h"
#include "call_ids.h"
#include "h2_deadlines.h"
#include "h2_streams.h"

struct h2_reader *readers[MAX_FDS];
/* Since when each public connection has had no stream the server has not ended (0: one runs, or not a public
 * connection), and how many are open: at the cap, a new connection closes the one idle the longest, never one whose
 * call runs (as the HTTP port does, http_front.c). */
static int64_t idle_since[MAX_FDS];
static long open_public;

static void mark_idle(const struct h2_reader *r, int idle) {
    if (r->public && r->fd >= 0 && r->fd < MAX_FDS)
        __atomic_store_n(&idle_since[r->fd], idle ? front_now_ns() : 0, __ATOMIC_RELAXED);
}

static uint32_t slot_of(uint32_t stream, uint32_t room) {
    return (stream * 2654435761u) & (room - 1);
}

struct stream_state *table_find(const struct h2_reader *r, uint32_t stream) {
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

void set_state(struct h2_reader *r, struct stream_state *s, uint32_t state) {
    if (s->state == PEER_OPEN) r->peer_open--;
    s->state = (uint16_t)state;
    if (s->state == PEER_OPEN) r->peer_open++;
    else if (s->due != 0) stream_due(r, s, 0); /* its message is whole (or reset): nothing more is due */
    recount(r, s);
}

void table_put(struct h2_reader *r, uint32_t stream, uint32_t state) {
    struct stream_state *known = table_find(r, stream);
    if (known != NULL) {
        set_state(r, known, state);
        return;
    }
    if (stream == 0 || !make_room(r)) return; /* out of memory: its RST_STREAM becomes a WINDOW_UPDATE */
    uint32_t at = slot_of(stream, r->stream_room);
    while (r->streams[at].stream != 0) at = (at + 1) & (r->stream_room - 1);
    r->streams[at] = (struct stream_state){stream, 0, 0, NULL, r->server_initial, r->client_initial, 0, 0};
    if (r->stream_count++ == 0) mark_idle(r, 0);
    set_state(r, &r->streams[at], state);
}

/* Removes the stream (backward-shift deletion: no tombstones to fill the table). */
void table_drop(struct h2_reader *r, struct stream_state *gone) {
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
    if (--r->stream_count == 0) mark_idle(r, 1);
}

/* The server ended the stream: it leaves the table, and the backlog if nobody waited for it. */
void server_ended(struct h2_reader *r, uint32_t stream) {
    struct stream_state *known = table_find(r, stream);
    if (known == NULL) return;
    if (known->state == ORPHAN && !(known->facts & ANSWERED)) count_orphans(r, -1);
    table_drop(r, known);
}

/* The server began its answer on the stream (its HEADERS, not ending it): the call has run. What is left is writing
 * the answer, which flow control lets a client hold up (a window of 0): the call leaves the waiting bound and the
 * backlog. */
void server_answered(struct h2_reader *r, uint32_t stream) {
    struct stream_state *known = table_find(r, stream);
    if (known == NULL || (known->facts & ANSWERED)) return;
    if (known->state == ORPHAN) count_orphans(r, -1);
    known->facts |= ANSWERED;
    recount(r, known);
}

/* The peer's reset streams the server still runs change by change: this connection's count, the public ports' (the
 * bounds, bounds.h) and the edge's backlog. */
void count_orphans(struct h2_reader *r, int64_t change) {
    r->orphans = (uint32_t)((int64_t)r->orphans + change);
    if (r->public) __atomic_add_fetch(&orphaned_calls, change, __ATOMIC_RELAXED);
    backlog_add(change);
}

/* Whether the server still runs a call of this connection (a stream the peer ended its side of, or reset). */
int runs_calls(const struct h2_reader *r) {
    for (uint32_t i = 0; i < r->stream_room; i++) {
        if (r->streams[i].stream != 0 && r->streams[i].state != PEER_OPEN) return 1;
    }
    return 0;
}

int h2_watched(int fd) {
    return fd >= 0 && fd < MAX_FDS && readers[fd] != NULL;
}

void h2_forget(int fd) {
    if (fd < 0 || fd >= MAX_FDS || readers[fd] == NULL) return;
    struct h2_reader *reader = readers[fd];
    readers[fd] = NULL;
    deadlines_forget(fd);
    if (reader->public) {
        __atomic_store_n(&idle_since[fd], 0, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&open_public, 1, __ATOMIC_RELAXED);
    }
    count_orphans(reader, -(int64_t)reader->orphans); /* the connection is gone: so are its calls */
    if (reader->public) __atomic_sub_fetch(&running_calls, (int64_t)reader->counted, __ATOMIC_RELAXED);
    if (reader->public) deadlines_trim_soon(); /* its rooms, and what gRPC's threads held for it once they free it */
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
}

void h2_watch(int fd, int public) {
    h2_forget(fd);
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
    reader->fd = fd;
    reader->max_frame = 16384;
    reader->client_initial = reader->server_initial = DEFAULT_WINDOW;
    reader->conn_recv = reader->conn_send = DEFAULT_WINDOW;
    pthread_mutex_init(&reader->lock, NULL);
    pthread_mutex_init(&reader->wlock, NULL);
    readers[fd] = reader;
    if (public) {
        __atomic_add_fetch(&open_public, 1, __ATOMIC_RELAXED);
        mark_idle(reader, 1);
    }
}

int h2_room(void) {
    if (__atomic_load_n(&open_public, __ATOMIC_RELAXED) < front_max_connections()) return 0;
    int oldest = -1;
    int64_t since = INT64_MAX;
    for (int fd = 0; fd < MAX_FDS; fd++) {
        int64_t at = __atomic_load_n(&idle_since[fd], __ATOMIC_RELAXED);
        if (at != 0 && at < since) oldest = fd, since = at;
    }
    if (oldest < 0 || !__atomic_compare_exchange_n(&idle_since[oldest], &since, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return -1;
    shutdown(oldest, SHUT_RDWR); /* gRPC reads its end: it runs no call of it */
    return 0;
}
