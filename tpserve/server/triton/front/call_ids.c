/* call_ids: see call_ids.h. */
#define _GNU_SOURCE
#include "call_ids.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "libc_calls.h"

#define TABLE_VARIABLE "TRITON_CANCELLED_CALLS"
#define TABLE_BYTES ((size_t)CALL_SLOTS * 8)

static uint64_t *table;
static uint64_t last_id;

void call_ids_start(void) {
    const char *path = getenv(TABLE_VARIABLE);
    if (path == NULL || *path == 0 || table != NULL) return;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    void *map = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077) &&
        (size_t)st.st_size == TABLE_BYTES)
        map = mmap(NULL, TABLE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    libc_resolve();
    if (fd >= 0) real_close(fd);
    if (map == MAP_FAILED) {
        guard_say("triton_guard: cannot use the cancelled-calls table %s (not a 0600 file of this user of %zu bytes): "
                  "cancelled calls are computed\n", path, TABLE_BYTES);
        return;
    }
    uint64_t start = 0;
    if (getrandom(&start, sizeof start, 0) != (ssize_t)sizeof start) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        start = ((uint64_t)t.tv_sec << 32) ^ (uint64_t)t.tv_nsec ^ ((uint64_t)getpid() << 16);
    }
    last_id = start;
    table = map;
}

uint64_t call_id_next(void) {
    if (table == NULL) return 0;
    uint64_t id;
    do id = __atomic_add_fetch(&last_id, 1, __ATOMIC_RELAXED);
    while (id == 0);
    return id;
}

void call_id_cancelled(uint64_t id) {
    if (table != NULL && id != 0) __atomic_store_n(&table[id % CALL_SLOTS], id, __ATOMIC_RELAXED);
}

void call_id_hex(uint64_t id, char out[CALL_ID_HEX]) {
    static const char digits[] = "0123456789abcdef";
    for (int k = CALL_ID_HEX - 1; k >= 0; k--, id >>= 4) out[k] = digits[id & 0xf];
}
