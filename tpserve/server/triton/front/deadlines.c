/* deadlines: when each connection of a public port must have made its progress by, HTTP (http_front.c: a request's
 * head, then its body) and gRPC (h2_deadlines.c: a frame the guard holds, a stream's message) alike, in one table
 * read by one thread. Every 250 ms the thread shuts down the connections past theirs, each claimed first so that it
 * is shut down once: tritonserver's reader then sees the end of the stream (HTTP: the connection closes; gRPC: a
 * hang-up, the calls already made finish). A slow sender gives its place back instead of holding it. */
#define _GNU_SOURCE
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
