/* deadlines: when each connection of a public port must have made its progress by, HTTP (http_front.c: a request's
 * head, then its body) and gRPC (h2_deadlines.c: a frame the guard holds, a stream's message) alike, in one table
 * read by one thread. Every 250 ms the thread shuts down the connections past theirs, each claimed first so that it
 * is shut down once: tritonserver's reader then sees the end of the stream (HTTP: the connection closes; gRPC: a
 * hang-up, the calls already made finish). A slow sender gives its place back instead of holding it. The same thread
 * gives freed memory back to the system after a client's connection has gone or let a large room go
 * (deadlines_trim_soon): the one place the front trims, never on a reading thread. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#include "bounds.h"
#include "deadlines.h"
#include "libc_calls.h"

#define DEADLINE_FDS 65536

static int64_t due_at[DEADLINE_FDS];
static unsigned char kind_of[DEADLINE_FDS];
static unsigned long grpc_cuts; /* counted for the log's words */
#define TRIMS 4                   /* a second apart: gRPC frees a gone connection's buffers in its own time */
#define TRIM_EVERY_NS 1000000000
static int trims_left;            /* malloc_trim calls still due */
static int64_t next_trim;         /* when the next one is due (CLOCK_MONOTONIC ns) */

void deadlines_trim_soon(void) {
    /* a trim already due keeps its time: connections closing one after another get one trim a second */
    if (__atomic_exchange_n(&trims_left, TRIMS, __ATOMIC_RELAXED) <= 0)
        __atomic_store_n(&next_trim, front_now_ns() + TRIM_EVERY_NS, __ATOMIC_RELAXED);
}

static void trim_when_due(int64_t now) {
    int left = __atomic_load_n(&trims_left, __ATOMIC_RELAXED);
    if (left <= 0 || now < __atomic_load_n(&next_trim, __ATOMIC_RELAXED)) return;
    if (!__atomic_compare_exchange_n(&trims_left, &left, left - 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
    __atomic_store_n(&next_trim, now + TRIM_EVERY_NS, __ATOMIC_RELAXED);
    malloc_trim(0); /* every arena's free pages back to the system, the threads' arenas included */
}

void deadline_set(int fd, int64_t at, enum deadline_kind kind) {
    if (fd < 0 || fd >= DEADLINE_FDS) return;
    if (at != 0) __atomic_store_n(&kind_of[fd], (unsigned char)kind, __ATOMIC_RELAXED);
    __atomic_store_n(&due_at[fd], at, __ATOMIC_RELAXED);
}

static void cut(int fd) {
    shutdown(fd, SHUT_RDWR);
    if (__atomic_load_n(&kind_of[fd], __ATOMIC_RELAXED) != DEADLINE_GRPC) return;
    unsigned long n = __atomic_add_fetch(&grpc_cuts, 1, __ATOMIC_RELAXED);
    if (n <= 10 || n % 1000 == 0)
        guard_say("triton_guard: a gRPC client's frame or message did not come within its deadline: its "
                  "connection is closed once its calls end (%lu so far)\n", n);
}

static void *watch(void *unused) {
    (void)unused;
    for (;;) {
        struct timespec pause = {0, 250 * 1000 * 1000};
        nanosleep(&pause, NULL);
        int64_t now = front_now_ns();
        for (int fd = 0; fd < DEADLINE_FDS; fd++) {
            int64_t at = __atomic_load_n(&due_at[fd], __ATOMIC_RELAXED);
            if (at == 0 || at >= now) continue;
            if (__atomic_compare_exchange_n(&due_at[fd], &at, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) cut(fd);
        }
        trim_when_due(now);
    }
    return NULL;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int started = -1;

static void start_once(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, watch, NULL) != 0) return;
    pthread_detach(thread);
    started = 0;
}

int deadlines_start(void) {
    pthread_once(&once, start_once);
    return started;
}
