/* h2_deadlines: streams and frames have deadlines on a public port, as HTTP heads and bodies have (http_front.c). A
 * stream's header block opens it; its message must then begin within the head deadline (TRITON_GUARD_FRONT_LIMITS'
 * head_timeout_ms, 10 s unless set) and be whole within a body's (30 s, plus a second for each MiB its prefix
 * announces). A frame or header block the guard holds to read whole must be whole within the head deadline, plus a
 * second for each MiB it holds. A ModelStreamInfer stream (long-lived by design, where it is served) has no message
 * deadline. Each connection's earliest goes into the table HTTP's deadlines share (deadlines.c), whose thread shuts
 * the connection down past it: gRPC then reads its end as a hang-up (h2_gone.c): nothing more of the client is read,
 * the calls it made finish, and the connection closes. A client holding streams open with headers and no message, or
 * trickling a frame a byte at a time, gives its place back. */
#include <stdint.h>

#include "bounds.h"
#include "deadlines.h"
#include "h2_deadlines.h"

#define BODY_NS 30000000000LL   /* a message, once begun */
#define PER_MIB_NS 1000000000LL /* and a second for each MiB */

static int64_t earliest(int64_t a, int64_t b) { return a == 0 ? b : b == 0 ? a : a < b ? a : b; }

static void publish(struct h2_reader *r) {
    int64_t held = __atomic_load_n(&r->held_due, __ATOMIC_RELAXED);
    int64_t stream = __atomic_load_n(&r->stream_due, __ATOMIC_RELAXED);
    deadline_set(r->fd, r->gone ? 0 : earliest(held, stream), DEADLINE_GRPC);
}

/* The earliest deadline of the connection's streams, found again (the stream that set it is done or later now). */
static void rescan(struct h2_reader *r) {
    int64_t due = 0;
    uint32_t stream = 0;
    for (uint32_t i = 0; r->peer_open > 0 && i < r->stream_room; i++) {
        const struct stream_state *s = &r->streams[i];
        if (s->stream != 0 && s->due != 0 && (due == 0 || s->due < due)) due = s->due, stream = s->stream;
    }
    __atomic_store_n(&r->stream_due, due, __ATOMIC_RELAXED);
    r->due_stream = stream;
}

void stream_due(struct h2_reader *r, struct stream_state *s, int64_t due) {
    if (!r->public || s->due == due) return;
    int64_t before = s->due;
    s->due = due;
    if (due != 0 && (r->stream_due == 0 || due < r->stream_due)) {
        __atomic_store_n(&r->stream_due, due, __ATOMIC_RELAXED);
        r->due_stream = s->stream;
    } else if (s->stream == r->due_stream || (before != 0 && before <= r->stream_due)) {
        rescan(r);
    }
    publish(r);
}

void message_begun(struct h2_reader *r, struct stream_state *s, uint32_t length) {
    if (s->due != 0) stream_due(r, s, front_now_ns() + BODY_NS + (int64_t)(length >> 20) * PER_MIB_NS);
}

void held_changed(struct h2_reader *r) {
    if (!r->public) return;
    if (r->held_count == 0) {
        r->held_since = 0;
        __atomic_store_n(&r->held_due, 0, __ATOMIC_RELAXED);
    } else {
        if (r->held_since == 0) r->held_since = front_now_ns();
        int64_t due = r->held_since + front_head_ns() + (int64_t)(r->hold_room >> 20) * PER_MIB_NS;
        __atomic_store_n(&r->held_due, due, __ATOMIC_RELAXED);
    }
    publish(r);
}

/* The connection is forgotten: nothing of it is due. */
void deadlines_forget(int fd) { deadline_set(fd, 0, DEADLINE_GRPC); }
