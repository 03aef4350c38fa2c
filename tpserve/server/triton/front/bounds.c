/* bounds: see bounds.h. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../edge/admission_parse.h"
#include "bounds.h"
#include "libc_calls.h"

#define WAITING_VARIABLE "TRITON_GUARD_MAX_WAITING"
#define ADMISSION_VARIABLE "TRITON_GUARD_ADMISSION"
#define ADMISSION_MODELS 64 /* a region's entries of 32 bytes, as server/edge/admission_table.py has them */
#define ADMISSION_SIZE (128 * ADMISSION_MODELS * 32)
#define BACKLOG_VARIABLE "TRITON_GUARD_BACKLOG"
#define BACKLOG_SLOTS 64
#define BACKLOG_LINE 64 /* bytes per slot: one cache line each */

int64_t running_calls, orphaned_calls;
long waiting_bound;
static size_t max_message = 64u << 20, max_held = (size_t)1 << 30, held;
static int64_t head_ns = 10000000000LL; /* 10 s */
static long max_connections = 1024;
static uint64_t *admission; /* the admission table's region 0 (NULL: no admission by queue time) */
/* The edge's backlog: this server's slot of the file TRITON_GUARD_BACKLOG names ("slot:path", a file of the state
 * folder, 0600, made by the launcher: server/edge/cancel_table.py), counting the calls the edge gave up on that this
 * server still runs. The edge reads every slot and refuses new calls while the sum is over its bound
 * (server/edge/cancel_notice.c): what cancelling clients leave behind stays bounded. NULL: not behind the edge. */
static uint64_t *backlog;

/* A 0600 file of this user of size bytes, mapped shared; NULL where it is not one. */
static void *map_private(const char *path, size_t size) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    void *map = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077) && (size_t)st.st_size == size)
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) real_close(fd);
    return map == MAP_FAILED ? NULL : map;
}

/* This server's slot of the backlog file ("slot:path"), zeroed: the calls of a server that was before it are gone. */
static void open_backlog(const char *text) {
    char *path = NULL;
    long slot = text ? strtol(text, &path, 10) : -1;
    if (slot < 0 || slot >= BACKLOG_SLOTS || path == NULL || *path != ':') return;
    uint8_t *map = map_private(path + 1, BACKLOG_SLOTS * BACKLOG_LINE);
    if (map == NULL) {
        guard_say("triton_guard: cannot use the backlog file %s (not a 0600 file of this user of %d bytes): the edge "
                  "does not see what cancelled calls leave behind\n", path + 1, BACKLOG_SLOTS * BACKLOG_LINE);
        return;
    }
    backlog = (uint64_t *)(map + slot * BACKLOG_LINE);
    __atomic_store_n(backlog, 0, __ATOMIC_RELAXED);
}

/* The admission table (a 0600 file of this user, of its size), mapped; a table that is not is said and not used. */
static void open_admission(const char *path) {
    if (path == NULL || *path == 0) return;
    admission = map_private(path, ADMISSION_SIZE);
    if (admission == NULL)
        guard_say("triton_guard: cannot use the admission table %s (not a 0600 file of this user of %d bytes): no "
                  "admission by queue time\n", path, ADMISSION_SIZE);
}

void bounds_start(void) {
    libc_resolve();
    const char *waiting = getenv(WAITING_VARIABLE);
    if (waiting != NULL) waiting_bound = strtol(waiting, NULL, 10) > 0 ? strtol(waiting, NULL, 10) : 0;
    open_backlog(getenv(BACKLOG_VARIABLE));
    open_admission(getenv(ADMISSION_VARIABLE));
    unsetenv(WAITING_VARIABLE), unsetenv(BACKLOG_VARIABLE), unsetenv(ADMISSION_VARIABLE);
}

void front_limits(size_t message, size_t budget, long head_ms, long connections) {
    max_message = message;
    if (budget >= message) max_held = budget;
    if (head_ms > 0) head_ns = (int64_t)head_ms * 1000000;
    if (connections > 0) max_connections = connections;
}

long front_max_connections(void) { return max_connections; }

int64_t front_head_ns(void) { return head_ns; }

uint32_t front_max_message(void) { return max_message < UINT32_MAX ? (uint32_t)max_message : UINT32_MAX; }

int front_hold(size_t n) {
    if (__atomic_add_fetch(&held, n, __ATOMIC_RELAXED) <= max_held) return 1;
    __atomic_sub_fetch(&held, n, __ATOMIC_RELAXED);
    return 0;
}

void front_release(size_t n) { __atomic_sub_fetch(&held, n, __ATOMIC_RELAXED); }

int64_t front_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

const char *front_bounds_refuse(int64_t others, int lately) {
    if (waiting_bound > 0 && others >= waiting_bound) return WAITING_WHY;
    int64_t orphans = __atomic_load_n(&orphaned_calls, __ATOMIC_RELAXED);
    if (orphans >= BACKLOG_EVERYONE || (lately && orphans >= BACKLOG_BOUND)) return BACKLOG_WHY;
    return NULL;
}

const char *front_admission(const char *name, size_t len) {
    if (admission == NULL) return NULL;
    uint64_t hash = admission_hash(name, len);
    for (size_t i = 0; i < ADMISSION_MODELS; i++) {
        uint64_t *entry = admission + i * 4; /* hash, marked until (ns), refusals, queue time */
        if (__atomic_load_n(&entry[0], __ATOMIC_RELAXED) != hash) continue;
        if (__atomic_load_n(&entry[1], __ATOMIC_RELAXED) <= (uint64_t)front_now_ns()) return NULL;
        __atomic_add_fetch(&entry[2], 1, __ATOMIC_RELAXED);
        return ADMISSION_WHY;
    }
    return NULL;
}

void backlog_add(int64_t change) {
    if (backlog != NULL) __atomic_add_fetch(backlog, (uint64_t)change, __ATOMIC_RELAXED);
}

int front_port_list(const char *variable, int *ports, int room) {
    const char *text = getenv(variable);
    int count = 0;
    for (const char *at = text; at && *at && count < room;) {
        char *end;
        long port = strtol(at, &end, 10);
        if (end == at) break;
        if (port > 0 && port < 65536) ports[count++] = (int)port;
        at = *end == ',' ? end + 1 : end;
    }
    unsetenv(variable);
    return count;
}
