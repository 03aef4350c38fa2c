/* Telling the server which calls nobody waits for: an Envoy dynamic module (Envoy 1.40, ABI v0.2) on both listeners.
 *
 * tritonserver 2.51 must never learn that a gRPC call was cancelled (its frontend crashes on a call cancelled as
 * it completes; server/triton/triton_guard.c), so a cancelled call would be computed in full. This filter gives every
 * call an id of its own, x-edge-call (16 hex digits from the system's random source; a client's own header of
 * that name is replaced), which tritonserver passes to the model as a request parameter
 * (--grpc-header-forward-pattern / --http-header-forward-pattern). When a call ends at the edge without an
 * answer (the client cancelled it, hung up or timed out), its id goes into the cancelled-calls table: a file of
 * the server's state folder (0600) that the models map, slot id % CANCEL_SLOTS holding the id. A model checks
 * its requests' ids before computing and answers a cancelled one at once (triton_models/python_backend/cancelled_calls.py):
 * what nobody waits for costs a lookup, not a run.
 *
 * What is already in a model's queue when its client goes is still answered, one by one. So that this stays
 * bounded, each server's guard (server/triton/triton_guard.c) counts the calls the edge reset that it still runs, in its
 * slot of the backlog file; while the sum (with the calls cancelled in the last second, which a busy server may
 * not have read yet) is at the bound ("limit"), new calls from connections that cancelled in the last 2 s are refused
 * at once, and at 4 times the bound everyone's are: 503 / UNAVAILABLE with a retry hint
 * (response details "cancelled_calls_backlog"). Envoy counts both in its stats: dynamicmodulescustom.cancelled_calls
 * and dynamicmodulescustom.refused_cancelled_backlog.
 *
 * Beside it, a refusal for overload (HTTP 503, gRPC UNAVAILABLE answered at once: a full queue) gets a retry hint:
 * Retry-After: 1, grpc-retry-pushback-ms: 1000.
 *
 * Configuration: "table hex(path) backlog hex(path) limit n". The files are made by the launcher
 * (server/edge/cancel_table.py); without a backlog nothing is refused. */
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "envoy_module.h"

enum { CANCEL_SLOTS = 1 << 18 };
enum { BACKLOG_SLOTS = 64, BACKLOG_LINE = 64, RECENT = 4096, ATTRIBUTE_CONNECTION_ID = 28 };
enum { EVERYONE_AT = 4 };                       /* times the bound: past it, every new call is refused */
enum { BUCKETS = 16, WINDOW = 10 };             /* calls ended unanswered, per 100 ms: the last second counts */
static const uint64_t BUCKET_NS = 100000000ull;
static const uint64_t RECENT_NS = 2000000000ull; /* a connection that cancelled within this is a cancelling one */

extern bool envoy_dynamic_module_callback_http_set_header(void *filter, int header_type, dm_buffer key,
                                                          dm_buffer value);
extern void envoy_dynamic_module_callback_http_send_response(void *filter, uint32_t status, dm_header *headers,
                                                             size_t count, dm_buffer body, dm_buffer details);
extern bool envoy_dynamic_module_callback_http_filter_get_attribute_int(void *filter, int id, uint64_t *result);
extern int envoy_dynamic_module_callback_http_filter_config_define_counter(void *config, dm_buffer name,
                                                                          dm_buffer *labels, size_t count,
                                                                          size_t *id);
extern int envoy_dynamic_module_callback_http_filter_config_increment_counter(void *config, size_t id,
                                                                             dm_buffer *labels, size_t count,
                                                                             uint64_t value);

#define HEADER "x-edge-call"
#define WHY "the server is still answering calls their clients cancelled; retry after 1 s"

typedef struct {
  void *envoy;     /* Envoy's side of the configuration: its counters */
  uint64_t *slots; /* CANCEL_SLOTS ids, mapped from the table file */
  const uint8_t *backlog; /* BACKLOG_SLOTS lines, one per server: calls it runs that nobody waits for (NULL: none) */
  uint64_t limit;  /* new calls of cancelling connections refused from this backlog on (0: never) */
  uint64_t recent_connection[RECENT], recent_ns[RECENT]; /* who cancelled lately, by connection id % RECENT */
  uint64_t bucket_tick[BUCKETS], bucket_count[BUCKETS];  /* calls ended unanswered lately, by 10 ms */
  size_t cancelled_counter, refused_counter;
  bool counters;
} config;

typedef struct {
  config *config;
  uint64_t id;   /* 0: no call of ours (no id given) */
  uint64_t connection; /* Envoy's id of the client's connection (0: unknown) */
  bool answered; /* a response (the server's or the edge's own) began */
} call;

static int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* The value after "key " in the configuration's text, up to the next space or line end (NULL: none). */
static const char *field(const char *text, size_t length, const char *key, size_t *value_length) {
  size_t k = strlen(key);
  for (size_t at = 0; at + k + 1 <= length; at++) {
    if ((at == 0 || text[at - 1] == ' ' || text[at - 1] == '\n') && memcmp(text + at, key, k) == 0 &&
        text[at + k] == ' ') {
      size_t from = at + k + 1, to = from;
      while (to < length && text[to] != ' ' && text[to] != '\n') to++;
      *value_length = to - from;
      return text + from;
    }
  }
  return NULL;
}

/* The path given as hex under key (NULL: none, odd, not hex, or out of memory). */
static char *hex_path(const char *text, size_t length, const char *key) {
  size_t digits = 0;
  const char *hex = field(text, length, key, &digits);
  if (!hex || digits == 0 || digits % 2) return NULL;
  char *path = malloc(digits / 2 + 1);
  if (!path) return NULL;
  for (size_t i = 0; i < digits / 2; i++) {
    int high = hex_value(hex[2 * i]), low = hex_value(hex[2 * i + 1]);
    if (high < 0 || low < 0) return free(path), NULL;
    path[i] = (char)(high << 4 | low);
  }
  path[digits / 2] = 0;
  return path;
}

/* A private file of this user, of exactly bytes, mapped (MAP_FAILED: not that). */
static void *map_private(const char *path, size_t bytes) {
  int fd = path ? open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW) : -1;
  if (fd < 0) return MAP_FAILED;
  struct stat st;
  void *map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077) && (size_t)st.st_size == bytes)
    map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return map;
}

static void define_counters(config *c) {
  dm_buffer cancelled = {"cancelled_calls", 15}, refused = {"refused_cancelled_backlog", 25};
  c->counters =
      envoy_dynamic_module_callback_http_filter_config_define_counter(c->envoy, cancelled, NULL, 0,
                                                                      &c->cancelled_counter) == 0 &&
      envoy_dynamic_module_callback_http_filter_config_define_counter(c->envoy, refused, NULL, 0,
                                                                      &c->refused_counter) == 0;
}

static void count(config *c, size_t counter) {
  if (c->counters && c->envoy)
    envoy_dynamic_module_callback_http_filter_config_increment_counter(c->envoy, counter, NULL, 0, 1);
}

/* "table <hex path> [backlog <hex path> limit <n>]": NULL where a file is missing or not private. */
static config *open_config(void *envoy, const char *text, size_t length) {
  char *table = hex_path(text, length, "table"), *backlog = hex_path(text, length, "backlog");
  void *slots = map_private(table, (size_t)CANCEL_SLOTS * sizeof(uint64_t));
  void *lines = backlog ? map_private(backlog, BACKLOG_SLOTS * BACKLOG_LINE) : NULL;
  free(table), free(backlog);
  config *c = slots != MAP_FAILED && lines != MAP_FAILED ? calloc(1, sizeof *c) : NULL;
  if (!c) {
    if (slots != MAP_FAILED) munmap(slots, (size_t)CANCEL_SLOTS * sizeof(uint64_t));
    if (lines && lines != MAP_FAILED) munmap(lines, BACKLOG_SLOTS * BACKLOG_LINE);
    return NULL;
  }
  c->envoy = envoy, c->slots = slots, c->backlog = lines;
  size_t digits = 0;
  const char *limit = field(text, length, "limit", &digits);
  for (size_t i = 0; limit && i < digits && i < 12 && limit[i] >= '0' && limit[i] <= '9'; i++)
    c->limit = c->limit * 10 + (uint64_t)(limit[i] - '0');
  if (envoy) define_counters(c);
  return c;
}

const char *envoy_dynamic_module_on_program_init(void) { return ABI_VERSION; }

void *envoy_dynamic_module_on_http_filter_config_new(void *envoy_config, dm_buffer name, dm_buffer text) {
  if (name.length != 13 || memcmp(name.ptr, "cancel_notice", 13) != 0) return NULL;
  return open_config(envoy_config, text.ptr, text.length); /* NULL: Envoy refuses the configuration, saying so */
}

void envoy_dynamic_module_on_http_filter_config_destroy(void *c) {
  config *conf = c;
  if (!conf) return;
  munmap(conf->slots, (size_t)CANCEL_SLOTS * sizeof(uint64_t));
  if (conf->backlog) munmap((void *)conf->backlog, BACKLOG_SLOTS * BACKLOG_LINE);
  free(conf);
}

void *envoy_dynamic_module_on_http_filter_new(void *c, void *filter) {
  (void)filter;
  call *it = calloc(1, sizeof *it);
  if (it) it->config = c;
  return it;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Calls the servers run that nobody waits for, all servers together (a slot's count is its server's alone). */
static uint64_t backlog_of(const config *c) {
  uint64_t sum = 0;
  for (size_t i = 0; c->backlog && i < BACKLOG_SLOTS; i++)
    sum += __atomic_load_n((const uint64_t *)(c->backlog + i * BACKLOG_LINE), __ATOMIC_RELAXED);
  return sum;
}

/* A call ended unanswered now: counted in its 100 ms bucket (a bucket of an older tick starts again from 0). */
static void note_unanswered(config *c, uint64_t now) {
  uint64_t tick = now / BUCKET_NS;
  size_t at = tick % BUCKETS;
  if (__atomic_load_n(&c->bucket_tick[at], __ATOMIC_RELAXED) != tick) {
    __atomic_store_n(&c->bucket_count[at], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->bucket_tick[at], tick, __ATOMIC_RELAXED);
  }
  __atomic_add_fetch(&c->bucket_count[at], 1, __ATOMIC_RELAXED);
}

/* Calls ended unanswered in the last second: the servers may not have read their resets yet, so the guard's count
 * lags behind them (by what a busy server's reading thread is late: hundreds of calls in a storm). */
static uint64_t unanswered_lately(const config *c, uint64_t now) {
  uint64_t tick = now / BUCKET_NS, sum = 0;
  for (uint64_t back = 0; back < WINDOW && back <= tick; back++) {
    size_t at = (tick - back) % BUCKETS;
    if (__atomic_load_n(&c->bucket_tick[at], __ATOMIC_RELAXED) == tick - back)
      sum += __atomic_load_n(&c->bucket_count[at], __ATOMIC_RELAXED);
  }
  return sum;
}

static bool cancelling(const config *c, uint64_t connection, uint64_t now) {
  size_t at = connection % RECENT;
  return connection && __atomic_load_n(&c->recent_connection[at], __ATOMIC_RELAXED) == connection &&
         now - __atomic_load_n(&c->recent_ns[at], __ATOMIC_RELAXED) < RECENT_NS;
}

/* Refused while the backlog is at the bound: new calls of connections that cancelled lately (the servers' count
 * and what was cancelled in the last second, which they may not have read yet), and everyone's at EVERYONE_AT
 * times the servers' count. UNAVAILABLE / 503 with a retry hint. */
static bool refuse(void *filter, call *it) {
  config *c = it->config;
  if (!c->limit) return false;
  uint64_t load = backlog_of(c), now = now_ns();
  if (load < c->limit * EVERYONE_AT &&
      !(cancelling(c, it->connection, now) && load + unanswered_lately(c, now) >= c->limit))
    return false;
  dm_header hints[] = {{"retry-after", 11, "1", 1}, {"grpc-retry-pushback-ms", 22, "1000", 4}};
  static const char body[] = "{\"error\":\"" WHY "\"}";
  envoy_dynamic_module_callback_http_send_response(filter, 503, hints, 2, (dm_buffer){body, sizeof body - 1},
                                                   (dm_buffer){"cancelled_calls_backlog", 23});
  it->answered = true;
  count(c, c->refused_counter);
  return true;
}

int envoy_dynamic_module_on_http_filter_request_headers(void *filter, void *module, bool end_of_stream) {
  (void)end_of_stream;
  call *it = module;
  if (!it) return CONTINUE;
  if (!envoy_dynamic_module_callback_http_filter_get_attribute_int(filter, ATTRIBUTE_CONNECTION_ID,
                                                                   &it->connection))
    it->connection = 0;
  if (refuse(filter, it)) return STOP;
  uint64_t id = 0;
  while (id == 0 && getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = 0;
  char text[17];
  snprintf(text, sizeof text, "%016llx", (unsigned long long)id);
  dm_buffer key = {HEADER, sizeof HEADER - 1}, value = {text, 16};
  if (envoy_dynamic_module_callback_http_set_header(filter, HEADER_REQUEST, key, value)) it->id = id;
  return CONTINUE;
}

static bool header_is(void *filter, const char *name, const char *value) {
  dm_buffer found = {0}, key = {name, strlen(name)};
  size_t n = strlen(value);
  return envoy_dynamic_module_callback_http_get_header(filter, HEADER_RESPONSE, key, &found, 0, NULL) &&
         found.length == n && memcmp(found.ptr, value, n) == 0;
}

/* A refusal for overload (HTTP 503; gRPC UNAVAILABLE in a trailers-only answer: a full queue) tells the client
 * when to try again: Retry-After of 1 s, grpc-retry-pushback-ms of 1000 (gRPC's own retry hint). */
static void retry_hint(void *filter) {
  static const char after[] = "retry-after", pushback[] = "grpc-retry-pushback-ms";
  if (header_is(filter, ":status", "503")) {
    envoy_dynamic_module_callback_http_set_header(filter, HEADER_RESPONSE, (dm_buffer){after, sizeof after - 1},
                                                  (dm_buffer){"1", 1});
  } else if (header_is(filter, "grpc-status", "14")) {
    envoy_dynamic_module_callback_http_set_header(filter, HEADER_RESPONSE,
                                                  (dm_buffer){pushback, sizeof pushback - 1}, (dm_buffer){"1000", 4});
  }
}

int envoy_dynamic_module_on_http_filter_response_headers(void *f, void *m, bool e) {
  (void)e;
  if (m) ((call *)m)->answered = true;
  retry_hint(f);
  return CONTINUE;
}

int envoy_dynamic_module_on_http_filter_local_reply(void *f, void *m, uint32_t code, dm_buffer details, bool reset) {
  (void)f, (void)code, (void)details, (void)reset;
  if (m) ((call *)m)->answered = true; /* the edge answered it: the server never saw it */
  return CONTINUE;
}

void envoy_dynamic_module_on_http_filter_destroy(void *module) {
  call *it = module;
  if (!it) return;
  config *c = it->config;
  if (it->id && !it->answered && c) { /* nobody waits for this call any more */
    __atomic_store_n(&c->slots[it->id % CANCEL_SLOTS], it->id, __ATOMIC_RELAXED);
    uint64_t now = now_ns();
    note_unanswered(c, now);
    if (it->connection) {
      size_t at = it->connection % RECENT;
      __atomic_store_n(&c->recent_ns[at], now, __ATOMIC_RELAXED);
      __atomic_store_n(&c->recent_connection[at], it->connection, __ATOMIC_RELAXED);
    }
    count(c, c->cancelled_counter);
  }
  free(it);
}

/* The hooks Envoy resolves for every HTTP filter module; none of the others is needed here. */
int envoy_dynamic_module_on_http_filter_request_body(void *f, void *m, bool e) {
  (void)f, (void)m, (void)e;
  return CONTINUE;
}
int envoy_dynamic_module_on_http_filter_request_trailers(void *f, void *m) { (void)f, (void)m; return CONTINUE; }
int envoy_dynamic_module_on_http_filter_response_body(void *f, void *m, bool e) {
  (void)f, (void)m, (void)e;
  return CONTINUE;
}
int envoy_dynamic_module_on_http_filter_response_trailers(void *f, void *m) { (void)f, (void)m; return CONTINUE; }
void envoy_dynamic_module_on_http_filter_stream_complete(void *f, void *m) { (void)f, (void)m; }
