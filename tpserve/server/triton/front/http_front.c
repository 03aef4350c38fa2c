/*
 * http_front: the edge's HTTP checks inside tritonserver's own reads (see http_front.h), so that a client can reach
 * tritonserver's HTTP port with no second process on the path and still never hand it a request the edge would
 * refuse.
 *
 * How a request reaches tritonserver. Its bytes are taken from the socket into the connection's buffer as they
 * come, all but the request's final byte, which is left in the socket; nothing is handed to tritonserver meanwhile
 * (its reads get EAGAIN). Once the final byte has arrived, the whole request (a copy only this code writes) is
 * checked: the head strictly here (one request line, header lines of one reading each, Content-Length once), the
 * rest by http_checks.c. A request that passes is handed out from the buffer, and its final byte is handed out when
 * tritonserver reads it from the socket: so the socket stays readable until the request is handed out whole
 * (libevent reads 4 KiB per wake-up, level-triggered), and a read never reaches past a checked request into the
 * next one. A request that fails is answered here (the edge's JSON error, `x-edge: refused`, `connection: close`)
 * and tritonserver reads the end of the connection: it never sees a byte of it.
 *
 * Heads are at most max_head bytes (431 beyond), bodies at most max_body (413, refused on the Content-Length, before
 * the body arrives), chunked bodies are refused (411: send Content-Length), and `Expect: 100-continue` is answered
 * here and left out of the head tritonserver reads. At most max_connections connections are open at once; one more
 * is closed at accept. Memory: a head per connection, and the requests being gathered within max_held bytes all
 * together (503 with a retry hint beyond). Time: a head must arrive within head_timeout_ms of its first byte, a body
 * within 30 s and a second per MiB of its head; a connection past that is shut down.
 *
 * Bounds: tritonserver's answers are followed as it writes them (their heads, then Content-Length or chunked bodies),
 * so that the requests it still runs are known. While it runs the waiting bound's worth of calls (HTTP and gRPC
 * together), or while BACKLOG_EVERYONE calls their clients cancelled still run, a new request is refused on its
 * head: 503 with Retry-After, as Envoy's circuit breaker refuses it.
 *
 * Calls nobody waits for (call_ids.h): where the server has a cancelled-calls table, each inference request is handed
 * out with a header line of its own id, x-edge-call, after its request line (a client's own x-edge-call lines are
 * left out, as Envoy's module replaces them). The ids of the requests tritonserver has not begun to answer are kept
 * in order; when the client hangs up (a thread waits on every connection for its end, EPOLLRDHUP: tritonserver does
 * not read a connection while it runs its request), when tritonserver reads the end, or when the connection closes,
 * they go into the table and the models answer those calls unrun. A client that half-closes its side counts as gone,
 * as Envoy counts it.
 */
#define _GNU_SOURCE
#include "http_front.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../edge/admission_parse.h"
#include "bounds.h"
#include "call_ids.h"
#include "deadlines.h"
#include "http_checks.h"

#pragma GCC diagnostic ignored "-Wformat-truncation" /* a refusal's message is capped on purpose */

#define PORTS_VARIABLE "TRITON_GUARD_FRONT_HTTP"
#define RULES_VARIABLE "TRITON_GUARD_RULES"
#define LIMITS_VARIABLE "TRITON_GUARD_FRONT_LIMITS"
#define MAX_FRONT_PORTS 8
#define FRONT_FDS 65536
#define KEEP_BUFFER (64 * 1024) /* a connection's buffer larger than this is freed between requests */
#define MAX_DISCARD (256u << 20) /* a refused body larger than this is not read to its end: the connection is closed */
#define WATCHED_IDS 4 /* the ids of a connection's unanswered requests the hang-up thread sees: its oldest */

struct field {
    size_t at, len; /* within the request's bytes */
    int count;      /* how many times the header came */
};

/* tritonserver's answers on a connection, as it writes them: where the current one stands. */
enum { ANSWER_HEAD, ANSWER_BODY, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, CHUNK_TRAILER, UNTIL_CLOSE };
struct answers {
    uint8_t state;
    uint8_t chunked, has_length, first_line;
    char line[65]; /* the start of the line being read (enough for the headers that say where a body ends) */
    size_t line_len;
    uint64_t left; /* of the body or chunk, and of a chunk's CRLF */
};

struct conn {
    struct answers answers;
    long running; /* requests handed to tritonserver it has not begun to answer */
    char *acc; /* the request gathered: bytes taken from the socket (and, past them, bytes only peeked at) */
    size_t acc_len, acc_room;
    size_t head_len, total; /* once the head is whole: its length, and the request's */
    struct field method, target, encoding, header_length, expect;
    char *out; /* the request handed out: its head (acc, or a head rewritten), then body (from acc), all but the
                  final byte of the two */
    size_t out_len, out_at;
    int out_owned;
    const char *body; /* where a head was rewritten: the body, handed out of acc as it is (never copied) */
    size_t body_len, body_at;
    char last; /* its final byte, handed out for the socket's final byte */
    int final_pending;
    int closing;        /* a refusal was written: reads end */
    size_t discard_left; /* after a refusal: the refused request's bytes still to come, read and dropped first */
    size_t reserved;     /* bytes of the front's memory budget this request holds (its whole length, once known) */
    int own_ids;         /* the client's own x-edge-call lines in this request's head: left out */
    uint64_t id;         /* this request's call id (0: none) */
    uint64_t *ids;       /* the ids of the requests handed out and not yet answered, oldest first (0: none) */
    size_t ids_len, ids_room;
    int ids_lost;        /* out of memory once: this connection's ids are no longer kept */
    int fd;
};

static struct conn *conns[FRONT_FDS];
static struct check_rules *rules;
static struct front_io io;
static int ports[MAX_FRONT_PORTS], port_count;
static size_t max_body = 64u << 20, max_head = 16u << 10;
static long max_connections = 1024, open_connections;
static long head_timeout_ms = 10000; /* a request's head must arrive within this of its first byte */
/* Since when each connection holds its slot with no request of its own running (CLOCK_MONOTONIC ns; 0: one runs, or
 * none is open): a new connection finding every slot taken closes the one idle or trickling its head the longest
 * instead of being refused, so that one client holding every slot with slow heads shuts out nobody who sends a whole
 * request, and a connection whose request runs is never the one closed. */
static int64_t idle_since[FRONT_FDS];
/* For the thread that notes hang-ups (watch_hang_ups): each connection's oldest unanswered ids, and its generation
 * (one more at each accept of the descriptor), so that an end seen late is never taken for a later connection's. */
static uint64_t watched_ids[FRONT_FDS][WATCHED_IDS];
static uint32_t generation[FRONT_FDS];
static int hang_ups = -1; /* the epoll instance, EPOLLRDHUP on each connection */

static void say(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *format, ...) {
    char line[512];
    va_list args;
    va_start(args, format);
    int length = vsnprintf(line, sizeof line, format, args);
    va_end(args);
    if (length > 0 && io.socket_write) (void)io.socket_write(2, line, (size_t)length < sizeof line ? (size_t)length : sizeof line - 1);
}

static char *read_private(const char *path, size_t *len) {
    FILE *f = fopen(path, "rbe");
    struct stat st;
    if (f == NULL || fstat(fileno(f), &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) || st.st_size > (1 << 24)) {
        if (f) fclose(f);
        return NULL;
    }
    char *text = malloc((size_t)st.st_size + 1);
    *len = text ? fread(text, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    return text;
}

/* When the connection's request must be whole by (CLOCK_MONOTONIC ns; 0: none pending), in the table the gRPC
 * deadlines share (deadlines.c): past it, its thread shuts the connection down, so that slow senders cannot hold every
 * connection (tritonserver's reader then sees the end of the stream and closes it). A head must come within
 * head_timeout_ms of its first byte; a body within 30 s plus a second per MiB after its head. */
static void set_deadline(int fd, int64_t at) { deadline_set(fd, at, DEADLINE_HTTP); }

/* Waits for connections' ends (EPOLLRDHUP, or a reset): the ids of the requests the connection still waited for go
 * into the cancelled-calls table at once (tritonserver reads nothing of a connection while it runs its request, so
 * its own read of the end comes only after the answer). The generation read before and after the ids must be the
 * one the end was seen for. */
static void *watch_hang_ups(void *unused) {
    (void)unused;
    struct epoll_event seen[64];
    for (;;) {
        int n = epoll_wait(hang_ups, seen, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = (int)(uint32_t)seen[i].data.u64;
            uint32_t then = (uint32_t)(seen[i].data.u64 >> 32);
            if (fd < 0 || fd >= FRONT_FDS || __atomic_load_n(&generation[fd], __ATOMIC_SEQ_CST) != then) continue;
            uint64_t ids[WATCHED_IDS];
            for (int k = 0; k < WATCHED_IDS; k++) ids[k] = __atomic_load_n(&watched_ids[fd][k], __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&generation[fd], __ATOMIC_SEQ_CST) != then) continue;
            for (int k = 0; k < WATCHED_IDS; k++) call_id_cancelled(ids[k]);
        }
    }
    return NULL;
}

int front_start(const struct front_io *given) {
    io = *given;
    port_count = front_port_list(PORTS_VARIABLE, ports, MAX_FRONT_PORTS);
    const char *limits = getenv(LIMITS_VARIABLE);
    if (limits) {
        unsigned long long body = 0, head = 0, budget = 0;
        long conns_cap = 0, timeout = 0;
        int got = sscanf(limits, "%llu,%llu,%ld,%llu,%ld", &body, &head, &conns_cap, &budget, &timeout);
        if (got >= 3 && body && head && conns_cap > 0)
            max_body = (size_t)body, max_head = (size_t)head, max_connections = conns_cap;
        if (got == 5 && timeout > 0) head_timeout_ms = timeout;
        /* gRPC messages as HTTP bodies, all held together, frames and heads alike */
        front_limits(max_body, got >= 4 ? (size_t)budget : 0, head_timeout_ms, max_connections);
    }
    const char *path = getenv(RULES_VARIABLE);
    int failed = 0;
    if (port_count > 0) {
        size_t len = 0;
        char *rules_text = path ? read_private(path, &len) : NULL;
        char why[300] = "no rules file named";
        if (rules_text) rules = check_rules_load(rules_text, len, why, sizeof why);
        else if (path) snprintf(why, sizeof why, "%s is not a private file of this user (0600, at most 16 MiB)", path);
        free(rules_text);
        if (rules == NULL) {
            say("triton_guard: the HTTP checks cannot start (%s): not serving port %d unchecked\n", why, ports[0]);
            failed = 1;
        }
    }
    unsetenv(RULES_VARIABLE), unsetenv(LIMITS_VARIABLE); /* the ports: front_port_list unset them */
    if (!failed && port_count > 0) {
        if (deadlines_start() < 0) {
            say("triton_guard: cannot start the thread that ends slow requests: not serving port %d\n", ports[0]);
            return -1;
        }
        hang_ups = epoll_create1(EPOLL_CLOEXEC);
        pthread_t watcher;
        if (hang_ups >= 0 && pthread_create(&watcher, NULL, watch_hang_ups, NULL) == 0) {
            pthread_detach(watcher);
        } else {
            if (hang_ups >= 0) io.socket_close(hang_ups);
            hang_ups = -1; /* hang-ups are then noted when tritonserver reads them */
        }
    }
    return failed ? -1 : 0;
}

int front_ports(void) { return port_count; }

const struct check_rules *front_rules(void) { return rules; }

int front_port(int port) {
    for (int i = 0; i < port_count; i++)
        if (ports[i] == port) return 1;
    return 0;
}

int front_watched(int fd) { return fd >= 0 && fd < FRONT_FDS && conns[fd] != NULL; }

/* The requests handed out and not answered: nobody waits for them any more (the client's end was read, or the
 * connection closes). */
/* The oldest ids, where the hang-up thread sees them. */
static void mirror(const struct conn *c) {
    for (size_t k = 0; k < WATCHED_IDS; k++)
        __atomic_store_n(&watched_ids[c->fd][k], k < c->ids_len ? c->ids[k] : 0, __ATOMIC_SEQ_CST);
}

static void nobody_waits(struct conn *c) {
    for (size_t k = 0; k < c->ids_len; k++) call_id_cancelled(c->ids[k]);
    c->ids_len = 0;
    mirror(c);
}

/* A request handed out whole: its id kept until its answer's head is written. */
static void handed_out(struct conn *c) {
    if (c->ids_lost) return;
    if (c->ids_len == c->ids_room) {
        size_t room = c->ids_room ? c->ids_room * 2 : 4;
        uint64_t *grown = room < SIZE_MAX / sizeof *grown ? realloc(c->ids, room * sizeof *grown) : NULL;
        if (grown == NULL) {
            c->ids_lost = 1, c->ids_len = 0;
            return;
        }
        c->ids = grown, c->ids_room = room;
    }
    c->ids[c->ids_len++] = c->id;
    if (c->ids_len <= WATCHED_IDS) mirror(c);
}

/* An answer's head written: the oldest request is answered. */
static void answered(struct conn *c) {
    if (c->ids_len == 0) return;
    memmove(c->ids, c->ids + 1, (c->ids_len - 1) * sizeof *c->ids);
    c->ids_len--;
    mirror(c);
}

void front_forget(int fd) {
    if (!front_watched(fd)) return;
    struct conn *c = conns[fd];
    conns[fd] = NULL;
    set_deadline(fd, 0);
    __atomic_store_n(&idle_since[fd], 0, __ATOMIC_RELAXED);
    front_release(c->reserved);
    deadlines_trim_soon(); /* what tritonserver's threads held for it, once they free it */
    __atomic_sub_fetch(&running_calls, c->running, __ATOMIC_RELAXED);
    nobody_waits(c); /* closed before its answers were written: nobody reads them (and the watched ids cleared) */
    if (c->out_owned) free(c->out);
    free(c->acc);
    free(c->ids);
    free(c);
    __atomic_sub_fetch(&open_connections, 1, __ATOMIC_RELAXED);
}

/* Every slot is taken: the connection idle (or gathering its head) the longest is shut down, and tritonserver's
 * reader closes it; 0 when one was, -1 when every connection has a request running. */
static int evict_idlest(int fd) {
    int oldest = -1;
    int64_t since = INT64_MAX;
    for (int other = 0; other < FRONT_FDS; other++) {
        int64_t at = __atomic_load_n(&idle_since[other], __ATOMIC_RELAXED);
        if (at != 0 && at < since && other != fd) oldest = other, since = at;
    }
    if (oldest < 0 || !__atomic_compare_exchange_n(&idle_since[oldest], &since, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return -1;
    set_deadline(oldest, 0);
    shutdown(oldest, SHUT_RDWR);
    return 0;
}

int front_accepted(int fd) {
    front_forget(fd);
    if (fd < 0 || fd >= FRONT_FDS) return -1;
    if (__atomic_add_fetch(&open_connections, 1, __ATOMIC_RELAXED) > max_connections && evict_idlest(fd) < 0) {
        __atomic_sub_fetch(&open_connections, 1, __ATOMIC_RELAXED);
        return -1;
    }
    __atomic_store_n(&idle_since[fd], front_now_ns(), __ATOMIC_RELAXED);
    conns[fd] = calloc(1, sizeof(struct conn));
    if (conns[fd] == NULL) {
        __atomic_sub_fetch(&open_connections, 1, __ATOMIC_RELAXED);
        return -1;
    }
    conns[fd]->answers.first_line = 1;
    conns[fd]->fd = fd;
    uint32_t now = __atomic_add_fetch(&generation[fd], 1, __ATOMIC_SEQ_CST);
    if (hang_ups >= 0) { /* its end, or a reset: once, edge-triggered */
        struct epoll_event wanted = {.events = EPOLLRDHUP | EPOLLET, .data.u64 = ((uint64_t)now << 32) | (uint32_t)fd};
        (void)epoll_ctl(hang_ups, EPOLL_CTL_ADD, fd, &wanted);
    }
    return 0;
}

static int grow(struct conn *c, size_t room) {
    if (room <= c->acc_room) return 0;
    size_t want = c->acc_room ? c->acc_room : 4096;
    while (want < room) want = want > SIZE_MAX / 2 ? room : want * 2;
    char *grown = realloc(c->acc, want);
    if (grown == NULL) return -1;
    c->acc = grown;
    c->acc_room = want;
    return 0;
}

static const char *reason_of(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    default: return "Service Unavailable";
    }
}

/* The refusal, as the edge words it; the connection ends after it (tritonserver reads its end). */
static int refuse(int fd, struct conn *c, int status, const char *why) {
    char body[CHECK_WHY + 32], answer[CHECK_WHY + 256];
    int n = snprintf(body, sizeof body, "{\"error\":\"%s\"}", why);
    for (int i = 10; i < n - 2; i++)
        if ((unsigned char)body[i] < 0x20 || body[i] == '"' || body[i] == '\\' || body[i] == 0x7f) body[i] = ' ';
    int length = snprintf(answer, sizeof answer,
                          "HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nx-edge: refused\r\ncontent-length: %d\r\n"
                          "%sconnection: close\r\n\r\n%s",
                          status, reason_of(status), n, status == 503 || status == 429 ? "retry-after: 1\r\n" : "",
                          body);
    if (length > 0) (void)io.socket_write(fd, answer, (size_t)length < sizeof answer ? (size_t)length : sizeof answer - 1);
    /* The rest of the refused request is read and dropped before the connection ends, so that a client still
     * sending its body reads the answer instead of a reset; where its length is unknown (a head refused before its
     * end) or too large, what has arrived is dropped and the connection ends. */
    size_t left = c->total > c->acc_len ? c->total - c->acc_len : 0;
    if (c->head_len && left <= MAX_DISCARD) {
        c->discard_left = left;
    } else {
        char drain[4096];
        for (int i = 0; i < 256 && io.socket_recv(fd, drain, sizeof drain, MSG_DONTWAIT) > 0; i++) continue;
    }
    c->closing = 1;
    return -2;
}

/* After a refusal: the refused request's remaining bytes dropped as they come; then the end of the stream. */
static ssize_t drop_rest(int fd, struct conn *c) {
    char drain[16384];
    while (c->discard_left > 0) {
        ssize_t got = io.socket_recv(fd, drain, c->discard_left < sizeof drain ? c->discard_left : sizeof drain, MSG_DONTWAIT);
        if (got == 0) break;
        if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : 0;
        c->discard_left -= (size_t)got;
    }
    c->discard_left = 0;
    return 0;
}

static int tchar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int same_name(const char *text, size_t len, const char *name) {
    return len == strlen(name) && strncasecmp(text, name, len) == 0;
}

static void note(struct field *f, size_t at, size_t len) {
    if (f->count++ == 0) f->at = at, f->len = len;
}

/* The head (acc[0, head_len), ending in an empty line) read strictly: 0, or the status to refuse it with. */
static int read_head(struct conn *c, size_t head_len, size_t *content_length, char *why, size_t why_room) {
    const char *t = c->acc;
    size_t at = 0, end = head_len - 2; /* the final empty line's CRLF */
    size_t line_end = (size_t)((const char *)memmem(t, head_len, "\r\n", 2) - t);
    size_t i = 0;
    while (i < line_end && tchar(t[i])) i++;
    if (i == 0 || i > 20 || t[i] != ' ') return snprintf(why, why_room, "the request line has no method"), 400;
    c->method = (struct field){0, i, 1};
    size_t target = ++i;
    while (i < line_end && (unsigned char)t[i] > 0x20 && (unsigned char)t[i] < 0x7f) i++;
    if (i == target || t[i] != ' ') return snprintf(why, why_room, "the request line has no target"), 400;
    c->target = (struct field){target, i - target, 1};
    if (line_end - i - 1 != 8 || (memcmp(t + i + 1, "HTTP/1.1", 8) != 0 && memcmp(t + i + 1, "HTTP/1.0", 8) != 0))
        return snprintf(why, why_room, "only HTTP/1.1 and HTTP/1.0 requests are served here"), 400;
    struct field length = {0};
    int chunked = 0;
    for (at = line_end + 2; at < end;) {
        size_t stop = (size_t)((const char *)memmem(t + at, head_len - at, "\r\n", 2) - t);
        size_t colon = at;
        while (colon < stop && tchar(t[colon])) colon++;
        if (colon == at || colon >= stop || t[colon] != ':')
            return snprintf(why, why_room, "a header line is not 'name: value' (no folding, no spaces in names)"), 400;
        size_t v = colon + 1, w = stop;
        for (size_t k = v; k < stop; k++) {
            unsigned char b = (unsigned char)t[k];
            if ((b < 0x20 && b != '\t') || b == 0x7f)
                return snprintf(why, why_room, "a header value holds a control character"), 400;
        }
        while (v < w && (t[v] == ' ' || t[v] == '\t')) v++;
        while (w > v && (t[w - 1] == ' ' || t[w - 1] == '\t')) w--;
        const char *name = t + at;
        size_t name_len = colon - at;
        if (same_name(name, name_len, "content-length")) note(&length, v, w - v);
        else if (same_name(name, name_len, "transfer-encoding")) chunked = 1;
        else if (same_name(name, name_len, "content-encoding")) note(&c->encoding, v, w - v);
        else if (same_name(name, name_len, "inference-header-content-length")) note(&c->header_length, v, w - v);
        else if (same_name(name, name_len, CALL_ID_NAME)) c->own_ids++;
        else if (same_name(name, name_len, "expect")) {
            if (!same_name(t + v, w - v, "100-continue"))
                return snprintf(why, why_room, "only 'Expect: 100-continue' is understood here"), 417;
            note(&c->expect, at, stop + 2 - at); /* the whole line: left out of what tritonserver reads */
        }
        at = stop + 2;
    }
    if (chunked) return snprintf(why, why_room, "chunked bodies are not accepted here: send Content-Length"), 411;
    if (c->expect.count > 1) return snprintf(why, why_room, "the header expect appears %d times", c->expect.count), 400;
    *content_length = 0;
    if (length.count > 1) return snprintf(why, why_room, "the header content-length appears %d times", length.count), 400;
    if (length.count == 1) {
        int plain = length.len >= 1 && length.len <= 15 && !(length.len > 1 && t[length.at] == '0');
        for (size_t k = 0; k < length.len && plain; k++) plain = t[length.at + k] >= '0' && t[length.at + k] <= '9';
        if (!plain) return snprintf(why, why_room, "Content-Length is not a plain whole number"), 400;
        *content_length = (size_t)strtoull(strndupa(t + length.at, length.len), NULL, 10);
    }
    if (*content_length > max_body)
        return snprintf(why, why_room, "a body of %zu bytes is over the limit of %zu", *content_length, max_body), 413;
    return 0;
}

static int ends_with(const char *text, size_t len, const char *tail);

/* Whether the request whose head was read is an inference (what waits on a model, and what gets a call id). */
static int is_inference(const struct conn *c) {
    const char *target = c->acc + c->target.at;
    size_t len = c->target.len;
    return c->method.len == 4 && memcmp(c->acc + c->method.at, "POST", 4) == 0 &&
           (ends_with(target, len, "/infer") || ends_with(target, len, "/generate") ||
            ends_with(target, len, "/generate_stream"));
}

/* The head as tritonserver reads it (c->out, owned): its request line, its call id's line (c->id), its header
 * lines but the client's own x-edge-call and an Expect answered here; the body stays in acc. Its length; 0 out of
 * memory. */
static size_t rewrite_head(struct conn *c) {
    const char *t = c->acc;
    size_t line_end = (size_t)((const char *)memmem(t, c->head_len, "\r\n", 2) - t) + 2;
    char *out = malloc(c->head_len + CALL_ID_HEX + sizeof CALL_ID_NAME + 4);
    if (out == NULL) return 0;
    memcpy(out, t, line_end);
    size_t n = line_end;
    if (c->id) {
        memcpy(out + n, CALL_ID_NAME ": ", sizeof CALL_ID_NAME + 1);
        n += sizeof CALL_ID_NAME + 1;
        call_id_hex(c->id, out + n);
        n += CALL_ID_HEX;
        memcpy(out + n, "\r\n", 2), n += 2;
    }
    for (size_t at = line_end; at < c->head_len;) { /* each line, the final empty one too */
        size_t stop = (size_t)((const char *)memmem(t + at, c->head_len - at, "\r\n", 2) - t) + 2;
        const char *colon = memchr(t + at, ':', stop - at);
        int own = colon != NULL && same_name(t + at, (size_t)(colon - (t + at)), CALL_ID_NAME);
        if (!own && !(c->expect.count && at == c->expect.at)) memcpy(out + n, t + at, stop - at), n += stop - at;
        at = stop;
    }
    c->out = out;
    c->out_owned = 1;
    return n;
}

/* The request is whole (acc[0, total), its final byte only peeked at): checked, and made ready to hand out. */
static int release(int fd, struct conn *c) {
    const char *t = c->acc;
    struct check_request request = {
        .method = t + c->method.at, .method_len = c->method.len, .path = t + c->target.at, .path_len = c->target.len,
        .content_encoding = c->encoding.count ? t + c->encoding.at : NULL, .content_encoding_len = c->encoding.len,
        .content_encoding_count = c->encoding.count, .header_length = c->header_length.count ? t + c->header_length.at : NULL,
        .header_length_len = c->header_length.len, .header_length_count = c->header_length.count,
        .body = t + c->head_len, .body_len = c->total - c->head_len};
    struct check_verdict verdict;
    check_http_request(rules, &request, &verdict);
    if (verdict.status) {
        char final;
        (void)io.socket_recv(fd, &final, 1, MSG_DONTWAIT);
        c->acc_len = c->total; /* all of it read: nothing to drop */
        return refuse(fd, c, verdict.status, verdict.why);
    }
    size_t len = c->total, body = 0;
    c->out = c->acc;
    c->out_owned = 0;
    c->id = is_inference(c) ? call_id_next() : 0;
    if (c->expect.count || c->own_ids || c->id) {
        len = rewrite_head(c);
        if (len == 0) return refuse(fd, c, 503, "out of memory");
        body = c->total - c->head_len;
    }
    set_deadline(fd, 0); /* whole: tritonserver reads it at its own pace */
    c->out_at = c->body_at = 0;
    c->body = c->acc + c->head_len;
    if (body) { /* the final byte is the body's */
        c->out_len = len;
        c->body_len = body - 1;
        c->last = c->body[body - 1];
    } else {
        c->out_len = len - 1;
        c->body_len = 0;
        c->last = c->out[len - 1];
    }
    c->final_pending = 1;
    return 1;
}

static void next_request(int fd, struct conn *c) {
    set_deadline(fd, 0);
    front_release(c->reserved);
    c->reserved = 0;
    if (c->out_owned) free(c->out);
    c->out = NULL;
    c->out_owned = 0;
    c->out_len = c->out_at = 0;
    c->body = NULL;
    c->body_len = c->body_at = 0;
    c->final_pending = 0;
    c->acc_len = c->head_len = c->total = 0;
    memset(&c->method, 0, sizeof c->method), memset(&c->target, 0, sizeof c->target);
    memset(&c->encoding, 0, sizeof c->encoding), memset(&c->header_length, 0, sizeof c->header_length);
    memset(&c->expect, 0, sizeof c->expect);
    c->own_ids = 0;
    if (c->acc_room > KEEP_BUFFER) {
        free(c->acc);
        c->acc = NULL;
        c->acc_room = 0;
    }
}

static int ends_with(const char *text, size_t len, const char *tail) {
    size_t n = strlen(tail);
    return len >= n && memcmp(text + len - n, tail, n) == 0;
}

/* The status a request whose head was read is refused with for the bounds (*why says why), or 0: only inferences
 * wait (health, metadata and admin requests are answered at once, and a supervisor's probes must never be refused
 * for load). */
static int bounded(const struct conn *c, const char **why) {
    const char *target = c->acc + c->target.at;
    size_t len = c->target.len;
    if (!is_inference(c)) return 0;
    *why = front_bounds_refuse(__atomic_load_n(&running_calls, __ATOMIC_RELAXED), 0); /* not counted yet */
    if (*why != NULL) return 503;
    const char *model;
    size_t model_len;
    if (!admission_model_from_path(target, len, &model, &model_len)) return 0;
    *why = front_admission(model, model_len);
    return *why != NULL ? 429 : 0;
}

/* More of the request from the socket: 1 whole and ready to hand out; 0 the peer is gone; -1 with errno (EAGAIN:
 * nothing to hand out yet); -2 refused. */
static int gather(int fd, struct conn *c) {
    size_t queued = 0; /* bytes past acc_len the head's peek saw in the socket (they stay there until read) */
    if (c->head_len == 0) {
        size_t want = max_head + 4 - c->acc_len;
        if (grow(c, c->acc_len + want) < 0) return refuse(fd, c, 503, "out of memory");
        ssize_t n = io.socket_recv(fd, c->acc + c->acc_len, want, MSG_PEEK | MSG_DONTWAIT);
        if (n <= 0) return (int)n;
        if (c->acc_len == 0) set_deadline(fd, front_now_ns() + head_timeout_ms * 1000000);
        size_t from = c->acc_len > 3 ? c->acc_len - 3 : 0, seen = c->acc_len + (size_t)n;
        const char *end = memmem(c->acc + from, seen - from, "\r\n\r\n", 4);
        if (end == NULL) {
            if (seen > max_head)
                return refuse(fd, c, 431, "the request line and headers are over the limit of the edge");
            ssize_t got = io.socket_recv(fd, c->acc + c->acc_len, (size_t)n, MSG_DONTWAIT);
            if (got > 0) c->acc_len += (size_t)got;
            errno = EAGAIN;
            return -1;
        }
        size_t head_len = (size_t)(end - c->acc) + 4, body = 0;
        if (head_len > max_head) return refuse(fd, c, 431, "the request line and headers are over the limit of the edge");
        char why[CHECK_WHY];
        int status = read_head(c, head_len, &body, why, sizeof why);
        if (status == 413) { /* its length is known: the rest of it is dropped (the head was only peeked at) */
            c->head_len = head_len;
            c->total = head_len + body;
        }
        if (status) return refuse(fd, c, status, why);
        queued = (size_t)n;
        c->head_len = head_len;
        c->total = head_len + body;
        if (!front_hold(c->total)) {
            return refuse(fd, c, 503, "the server holds as many request bodies as it may; retry after 1 s");
        }
        c->reserved = c->total;
        const char *over = NULL;
        int refused = bounded(c, &over);
        if (refused) return refuse(fd, c, refused, over);
        set_deadline(fd, front_now_ns() + (30 + (int64_t)(body >> 20)) * 1000000000);
        if (c->expect.count && seen < c->total) {
            static const char go_on[] = "HTTP/1.1 100 Continue\r\n\r\n";
            (void)io.socket_write(fd, go_on, sizeof go_on - 1);
        }
    }
    if (grow(c, c->total) < 0) return refuse(fd, c, 503, "out of memory");
    size_t need = c->total - c->acc_len; /* at least 1: the final byte is never taken here */
    int whole = queued >= need; /* the peek saw all of it, the final byte too: no need to ask the socket again */
    if (need > 1) {
        int available = 0;
        if (whole)
            available = (int)(need - 1); /* need <= max_head + 4, within an int */
        else if (io.socket_ioctl(fd, FIONREAD, &available) < 0)
            available = 0;
        size_t take = (size_t)available < need - 1 ? (size_t)available : need - 1;
        if (take > 0) {
            ssize_t got = io.socket_recv(fd, c->acc + c->acc_len, take, MSG_DONTWAIT);
            if (got == 0) return 0;
            if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
            if (got > 0) c->acc_len += (size_t)got;
        }
    }
    if (!whole) { /* whole: its final byte, peeked with the head, is still queued */
        ssize_t final = io.socket_recv(fd, c->acc + c->total - 1, 1, MSG_PEEK | MSG_DONTWAIT);
        if (final <= 0) return (int)final;
    }
    if (c->acc_len + 1 == c->total) return release(fd, c);
    errno = EAGAIN; /* more of the body is on its way */
    return -1;
}

static size_t put_at(const struct iovec *iov, size_t parts, size_t offset, const char *bytes, size_t n) {
    size_t done = 0;
    for (size_t p = 0; p < parts && done < n; p++) {
        if (offset >= iov[p].iov_len) {
            offset -= iov[p].iov_len;
            continue;
        }
        size_t take = iov[p].iov_len - offset < n - done ? iov[p].iov_len - offset : n - done;
        memcpy((char *)iov[p].iov_base + offset, bytes + done, take);
        done += take;
        offset = 0;
    }
    return done;
}

ssize_t front_read(int fd, const struct iovec *iov, size_t parts) {
    struct conn *c = conns[fd];
    size_t room = 0, given = 0;
    for (size_t p = 0; p < parts; p++) room += iov[p].iov_len;
    if (room == 0) return 0;
    if (c->closing) return drop_rest(fd, c);
    for (;;) {
        if (c->out_at < c->out_len) {
            size_t n = c->out_len - c->out_at < room - given ? c->out_len - c->out_at : room - given;
            given += put_at(iov, parts, given, c->out + c->out_at, n);
            c->out_at += n;
            if (given == room) return (ssize_t)given;
        }
        if (c->body_at < c->body_len) {
            size_t n = c->body_len - c->body_at < room - given ? c->body_len - c->body_at : room - given;
            given += put_at(iov, parts, given, c->body + c->body_at, n);
            c->body_at += n;
            if (given == room) return (ssize_t)given;
        }
        if (c->final_pending) {
            char final;
            ssize_t got = io.socket_recv(fd, &final, 1, MSG_DONTWAIT);
            if (got == 1) {
                given += put_at(iov, parts, given, &c->last, 1);
                handed_out(c);
                next_request(fd, c);
                c->running++; /* handed whole: tritonserver runs it until it answers */
                __atomic_add_fetch(&running_calls, 1, __ATOMIC_RELAXED);
                __atomic_store_n(&idle_since[fd], 0, __ATOMIC_RELAXED);
                return (ssize_t)given;
            }
            return given ? (ssize_t)given : got;
        }
        int gathered = gather(fd, c);
        if (gathered == 1) continue;
        if (gathered == -2) return drop_rest(fd, c);
        if (gathered == 0 || (gathered < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            nobody_waits(c); /* the client's end, or its reset: its calls are not waited for */
        return gathered;
    }
}

int front_readable(int fd) {
    struct conn *c = conns[fd];
    if (c->closing) return 0;
    return (int)(c->out_len - c->out_at + c->body_len - c->body_at) + c->final_pending;
}

/* ---- tritonserver's answers, followed ---- */

static int header_is(const struct answers *a, const char *name) {
    size_t n = strlen(name);
    return a->line_len > n && strncasecmp(a->line, name, n) == 0;
}

/* A whole line of an answer's head (its start in a->line): the head's end begins the body. */
static void answer_line(struct conn *c) {
    struct answers *a = &c->answers;
    if (a->first_line) { /* the status line */
        a->first_line = 0;
        return;
    }
    if (a->line_len > 0) {
        if (header_is(a, "content-length:")) {
            a->has_length = 1;
            a->left = strtoull(a->line + 15, NULL, 10);
        } else if (header_is(a, "transfer-encoding:") && memmem(a->line, a->line_len, "chunked", 7)) {
            a->chunked = 1;
        }
        return;
    }
    if (c->running > 0) { /* its head is written: the request is answered */
        answered(c);
        c->running--;
        __atomic_sub_fetch(&running_calls, 1, __ATOMIC_RELAXED);
        if (c->running == 0) __atomic_store_n(&idle_since[c->fd], front_now_ns(), __ATOMIC_RELAXED);
    }
    if (a->chunked) a->state = CHUNK_SIZE;
    else if (a->has_length) a->state = a->left > 0 ? ANSWER_BODY : ANSWER_HEAD;
    else a->state = UNTIL_CLOSE; /* no length: the body ends with the connection */
    if (a->state == ANSWER_HEAD) a->first_line = 1;
}

/* One byte of a line (a head's, a chunk size's, a trailer's); 1 when it ends the line. */
static int line_byte(struct answers *a, char byte) {
    if (byte == '\n') {
        if (a->line_len > 0 && a->line[a->line_len - 1] == '\r') a->line_len--;
        a->line[a->line_len] = 0;
        return 1;
    }
    if (a->line_len < sizeof a->line - 1) a->line[a->line_len++] = byte;
    return 0;
}

static void answer_bytes(struct conn *c, const char *bytes, size_t n) {
    struct answers *a = &c->answers;
    for (size_t i = 0; i < n;) {
        if (a->state == ANSWER_BODY || a->state == CHUNK_DATA || a->state == CHUNK_END) {
            size_t take = a->left < n - i ? (size_t)a->left : n - i;
            a->left -= take, i += take;
            if (a->left > 0) continue;
            if (a->state == CHUNK_DATA) a->state = CHUNK_END, a->left = 2;
            else if (a->state == CHUNK_END) a->state = CHUNK_SIZE;
            else a->state = ANSWER_HEAD, a->first_line = 1, a->has_length = 0, a->chunked = 0;
            continue;
        }
        if (a->state == UNTIL_CLOSE) return;
        if (!line_byte(a, bytes[i++])) continue;
        if (a->state == ANSWER_HEAD) {
            answer_line(c);
        } else if (a->state == CHUNK_SIZE) {
            a->left = strtoull(a->line, NULL, 16);
            a->state = a->left > 0 ? CHUNK_DATA : CHUNK_TRAILER;
        } else if (a->line_len == 0) { /* the trailers' end: the next answer */
            a->state = ANSWER_HEAD, a->first_line = 1, a->has_length = 0, a->chunked = 0;
        }
        a->line_len = 0;
    }
}

void front_wrote(int fd, const struct iovec *iov, size_t parts, size_t sent) {
    if (!front_watched(fd)) return;
    struct conn *c = conns[fd];
    for (size_t p = 0; p < parts && sent > 0; p++) {
        size_t n = iov[p].iov_len < sent ? iov[p].iov_len : sent;
        answer_bytes(c, iov[p].iov_base, n);
        sent -= n;
    }
}
