/* h2_writing: the server's side of a watched HTTP/2 connection. Its frames are followed as it writes them: its SETTINGS
 * (held against the client once acknowledged), its window updates, and the streams its answers begin and end
 * (h2_streams.c). On a public port the window changes of a write are counted before it is sent, the guard's own
 * replies go out only between the server's frames (never inside one), and nothing is sent to a gone peer. */
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
#include "h2_gone.h"
#include "h2_own_frames.h"
#include "h2_streams.h"
#include "h2_writing.h"
#include "libc_calls.h"

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
void settings_acked(struct h2_reader *r) {
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
ssize_t guarded_write(int fd, const struct iovec *iov, size_t parts, ssize_t sent) {
    struct h2_reader *r = readers[fd];
    size_t total = 0;
    for (size_t p = 0; p < parts; p++) total += iov[p].iov_len;
    if (sent < 0 && !r->gone) hang_up(sent, errno, r);
    if (r->gone) sent = (ssize_t)total;
    if (sent > 0) server_wrote(fd, iov, parts, (size_t)sent);
    if (r->gone) wake(fd, r);
    return sent;
}

int fd_gone(int fd) {
    return h2_watched(fd) && readers[fd]->gone;
}

void before_writing(int fd, const struct iovec *iov, size_t parts) {
    if (h2_watched(fd) && readers[fd]->public) server_writes(fd, iov, parts);
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
struct h2_reader *writing(int fd) {
    if (!h2_watched(fd) || !readers[fd]->public) return NULL;
    struct h2_reader *r = readers[fd];
    pthread_mutex_lock(&r->wlock);
    return r;
}

/* After the server's write: replies that came meanwhile go too, and the connection is the next writer's. */
ssize_t written(int fd, struct h2_reader *r, ssize_t sent) {
    if (r == NULL) return sent;
    int error = errno;
    send_replies(fd, r);
    pthread_mutex_unlock(&r->wlock);
    errno = error;
    return sent;
}

/* The server may not write now (a reply is half sent): it waits for the socket, as for a full one. */
int held_back(int fd, struct h2_reader *r) {
    if (r == NULL || send_replies(fd, r)) return 0;
    pthread_mutex_unlock(&r->wlock);
    errno = EAGAIN;
    return 1;
}

/* After a read that queued replies: sent now if the server is between frames (else its next write sends them). */
void reply_now(int fd, struct h2_reader *r) {
    if (!r->public || r->reply_count == 0) return;
    pthread_mutex_lock(&r->wlock);
    send_replies(fd, r);
    pthread_mutex_unlock(&r->wlock);
}
