/* Telling the server which calls nobody waits for: an Envoy dynamic module (Envoy 1.40, ABI v0.2) on both listeners.
 *
 * tritonserver 2.51 must never learn that a gRPC call was cancelled (its frontend crashes on a call cancelled as
 * it completes; server/triton/front/h2_reading.c), so a cancelled call would be computed in full. This filter gives every
 * call an id of its own, x-edge-call (16 hex digits from the system's random source; a client's own header of
 * that name is replaced), which tritonserver passes to the model as a request parameter
 * (--grpc-header-forward-pattern / --http-header-forward-pattern). When a call ends at the edge without an
 * answer (the client cancelled it, hung up or timed out), its id goes into the cancelled-calls table: a file of
 * the server's state folder (0600) that the models map, slot id % CANCEL_SLOTS holding the id. A model checks
 * its requests' ids before computing and answers a cancelled one at once (triton_models/python_backend/cancelled_calls.py):
 * what nobody waits for costs a lookup, not a run.
 *
 * What is already in a model's queue when its client goes is still answered, one by one. So that this stays
 * bounded, each server's guard (server/triton/front/bounds.c) counts the calls the edge reset that it still runs, in its
 * slot of the backlog file; while the sum (with the calls cancelled in the last second, which a busy server may
 * not have read yet) is at the bound ("limit"), new calls from connections that cancelled in the last 2 s are refused
 * at once, and at 4 times the bound everyone's are: 503 / UNAVAILABLE with a retry hint
 * (response details "cancelled_calls_backlog"). Envoy counts both in its stats: dynamicmodulescustom.cancelled_calls
 * and dynamicmodulescustom.refused_cancelled_backlog.
 *
 * Beside it, a refusal for overload (HTTP 503, gRPC UNAVAILABLE answered at once: a full queue) gets a retry hint:
 * Retry-After: 1, grpc-retry-pushback-ms: 1000.
 *
 * Admission by queue time (where the server was started with queue budgets): each replica's supervisor measures its
 * models' queue time per request from tritonserver's own counters and marks, in its region of the admission table
 * (a file of the state folder, 0600: server/edge/admission_table.py), the models whose queue time is over their
 * budget. A new inference call for a model every replica marks is refused at once: HTTP 429 (gRPC UNAVAILABLE)
 * with the same retry hint, response details "admission_queue_time", counted in Envoy's stats
 * (dynamicmodulescustom.refused_queue_time) and in the table, which the supervisor of replica 0 exports
 * (tpserve_admission_refused_total). The model is read from the HTTP path, or from the first bytes of a gRPC
 * ModelInfer message (server/edge/admission_parse.h); where it cannot be read there, the call is admitted.
 *
 * Configuration: "table hex(path) backlog hex(path) limit n [admission hex(path) replicas n]". The files are made
 * by the launcher (server/edge/cancel_table.py, admission_table.py); without a backlog nothing is refused. */
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

#include "admission_parse.h"
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
extern void envoy_dynamic_module_callback_http_send_response_headers(void *filter, dm_header *headers, size_t count,
                                                                     bool end_stream);
extern bool envoy_dynamic_module_callback_http_filter_get_attribute_int(void *filter, int id, uint64_t *result);
extern int envoy_dynamic_module_callback_http_filter_config_define_counter(void *config, dm_buffer name,
                                                                          dm_buffer *labels, size_t count,
                                                                          size_t *id);
extern int envoy_dynamic_module_callback_http_filter_config_increment_counter(void *config, size_t id,
                                                                             dm_buffer *labels, size_t count,
                                                                             uint64_t value);

enum { ADMISSION_REGIONS = 128, ADMISSION_MODELS = 64, ADMISSION_ENTRY = 32 }; /* as admission_table.py has them */
enum { BODY_STOP_NO_BUFFER = 3 }; /* on_http_filter_request_body_status: StopIterationNoBuffer */
#define ADMISSION_BYTES ((size_t)ADMISSION_REGIONS * ADMISSION_MODELS * ADMISSION_ENTRY)
#define GRPC_INFER "/inference.GRPCInferenceService/ModelInfer"
#define GRPC_STREAM_INFER "/inference.GRPCInferenceService/ModelStreamInfer"
#define HEADER "x-edge-call"
#define WHY "the server is still answering calls their clients cancelled; retry after 1 s"

typedef struct {
  void *envoy;     /* Envoy's side of the configuration: its counters */
  uint64_t *slots; /* CANCEL_SLOTS ids, mapped from the table file */
  const uint8_t *backlog; /* BACKLOG_SLOTS lines, one per server: calls it runs that nobody waits for (NULL: none) */
  uint64_t limit;  /* new calls of cancelling connections refused from this backlog on (0: never) */
  uint64_t recent_connection[RECENT], recent_ns[RECENT]; /* who cancelled lately, by connection id % RECENT */
  uint64_t bucket_tick[BUCKETS], bucket_count[BUCKETS];  /* calls ended unanswered lately, by 10 ms */
  size_t cancelled_counter, refused_counter, admission_counter;
  bool counters;
  uint8_t *admission; /* ADMISSION_REGIONS regions of ADMISSION_MODELS entries: hash, refuse until (ns), refused */
  uint64_t replicas;  /* regions in use: a model is refused while every one of them marks it */
} config;

typedef struct {
  config *config;
  uint64_t id;   /* 0: no call of ours (no id given) */
  uint64_t connection; /* Envoy's id of the client's connection (0: unknown) */
  bool answered; /* a response (the server's or the edge's own) began */
  bool check_body; /* a gRPC inference call whose model the first bytes of its body name: headers held */
  bool grpc;       /* the call is gRPC (content-type application/grpc...) */
  bool refused;    /* the edge answered it: nothing more of it goes on */
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
  dm_buffer admission = {"refused_queue_time", 18};
  c->counters =
      envoy_dynamic_module_callback_http_filter_config_define_counter(c->envoy, cancelled, NULL, 0,
                                                                      &c->cancelled_counter) == 0 &&
      envoy_dynamic_module_callback_http_filter_config_define_counter(c->envoy, refused, NULL, 0,
                                                                      &c->refused_counter) == 0 &&
      envoy_dynamic_module_callback_http_filter_config_define_counter(c->envoy, admission, NULL, 0,
                                                                      &c->admission_counter) == 0;
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
  char *admission = hex_path(text, length, "admission");
  if (admission) {
    void *table = map_private(admission, ADMISSION_BYTES);
    free(admission);
    if (table == MAP_FAILED) { /* named but not a private file of ours: refuse the configuration */
      munmap(c->slots, (size_t)CANCEL_SLOTS * sizeof(uint64_t));
      if (c->backlog) munmap((void *)c->backlog, BACKLOG_SLOTS * BACKLOG_LINE);
      free(c);
      return NULL;
    }
    c->admission = table;
    const char *replicas = field(text, length, "replicas", &digits);
    for (size_t i = 0; replicas && i < digits && i < 4 && replicas[i] >= '0' && replicas[i] <= '9'; i++)
      c->replicas = c->replicas * 10 + (uint64_t)(replicas[i] - '0');
    if (c->replicas == 0 || c->replicas > ADMISSION_REGIONS) c->replicas = 1;
  }
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
  if (conf->admission) munmap(conf->admission, ADMISSION_BYTES);
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

/* The edge's answer to a call it refuses, with a retry hint. gRPC: a trailers-only answer, UNAVAILABLE (Envoy's
 * local reply from a dynamic module would say grpc-status 0, OK, with an empty message: a client would take the
 * refusal for an answer); HTTP: status with Retry-After and a JSON error. */
static void refuse_call(void *filter, call *it, uint32_t status, const char *why, const char *details) {
  if (it->grpc) {
    dm_header headers[] = {
        {":status", 7, "200", 3},
        {"content-type", 12, "application/grpc", 16},
        {"grpc-status", 11, "14", 2},
        {"grpc-message", 12, why, strlen(why)},
        {"grpc-retry-pushback-ms", 22, "1000", 4},
    };
    envoy_dynamic_module_callback_http_send_response_headers(filter, headers, 5, true);
  } else {
    char body[256];
    int n = snprintf(body, sizeof body, "{\"error\":\"%s\"}", why);
    size_t length = n < 0 ? 0 : (size_t)n < sizeof body ? (size_t)n : sizeof body - 1;
    dm_header hints[] = {{"retry-after", 11, "1", 1}, {"grpc-retry-pushback-ms", 22, "1000", 4}};
    envoy_dynamic_module_callback_http_send_response(filter, status, hints, 2, (dm_buffer){body, length},
                                                     (dm_buffer){details, strlen(details)});
  }
  it->answered = it->refused = true;
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
  refuse_call(filter, it, 503, WHY, "cancelled_calls_backlog");
  count(c, c->refused_counter);
  return true;
}

/* The entry of a model in a replica's region (NULL: that replica has not marked it). */
static uint64_t *admission_entry(const config *c, uint64_t region, uint64_t hash) {
  uint8_t *base = c->admission + region * ADMISSION_MODELS * ADMISSION_ENTRY;
  for (size_t i = 0; i < ADMISSION_MODELS; i++) {
    uint64_t *entry = (uint64_t *)(base + i * ADMISSION_ENTRY);
    if (__atomic_load_n(&entry[0], __ATOMIC_RELAXED) == hash) return entry;
  }
  return NULL;
}

/* Every replica marks the model as over its queue budget, now. */
static bool over_budget(const config *c, const char *name, size_t length) {
  uint64_t hash = admission_hash(name, length), now = now_ns();
  for (uint64_t r = 0; r < c->replicas; r++) {
    uint64_t *entry = admission_entry(c, r, hash);
    if (!entry || __atomic_load_n(&entry[1], __ATOMIC_RELAXED) <= now) return false;
  }
  return true;
}

/* Refused for its model's queue time: 429 (gRPC: UNAVAILABLE) with a retry hint; counted here and in the table. */
static bool admit(void *filter, call *it, const char *name, size_t length) {
  config *c = it->config;
  if (!c->admission || !over_budget(c, name, length)) return true;
  refuse_call(filter, it, 429, "the model's queue time is over its budget; retry after 1 s", "admission_queue_time");
  count(c, c->admission_counter);
  uint64_t *entry = admission_entry(c, 0, admission_hash(name, length));
  if (entry) __atomic_add_fetch(&entry[2], 1, __ATOMIC_RELAXED);
  return false;
}

static bool path_is(dm_buffer path, const char *want) {
  size_t n = strlen(want);
  return path.length == n && memcmp(path.ptr, want, n) == 0;
}

/* HTTP: the model is in the path, decided now. gRPC inference: in the body's first bytes; the headers are held
 * until then (a call without a body is Triton's to refuse). Returns false where the call was refused. */
static int admission_on_headers(void *filter, call *it, bool end_of_stream) {
  if (!it->config->admission) return CONTINUE;
  dm_buffer path = {0}, key = {":path", 5};
  if (!envoy_dynamic_module_callback_http_get_header(filter, HEADER_REQUEST, key, &path, 0, NULL) || !path.ptr)
    return CONTINUE;
  if (path_is(path, GRPC_INFER) || path_is(path, GRPC_STREAM_INFER)) {
    it->check_body = !end_of_stream;
    return it->check_body ? STOP : CONTINUE;
  }
  const char *name = NULL;
  size_t length = 0;
  if (admission_model_from_path(path.ptr, path.length, &name, &length) && !admit(filter, it, name, length))
    return STOP;
  return CONTINUE;
}

int envoy_dynamic_module_on_http_filter_request_headers(void *filter, void *module, bool end_of_stream) {
  (void)end_of_stream;
  call *it = module;
  if (!it) return CONTINUE;
  if (!envoy_dynamic_module_callback_http_filter_get_attribute_int(filter, ATTRIBUTE_CONNECTION_ID,
                                                                   &it->connection))
    it->connection = 0;
  dm_buffer type = {0}, content_type = {"content-type", 12};
  it->grpc = envoy_dynamic_module_callback_http_get_header(filter, HEADER_REQUEST, content_type, &type, 0, NULL) &&
             type.ptr && type.length >= 16 && memcmp(type.ptr, "application/grpc", 16) == 0;
  if (refuse(filter, it)) return STOP;
  uint64_t id = 0;
  while (id == 0 && getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = 0;
  char text[17];
  snprintf(text, sizeof text, "%016llx", (unsigned long long)id);
  dm_buffer key = {HEADER, sizeof HEADER - 1}, value = {text, 16};
  if (envoy_dynamic_module_callback_http_set_header(filter, HEADER_REQUEST, key, value)) it->id = id;
  return admission_on_headers(filter, it, end_of_stream);
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
/* A held gRPC inference call: its model from the first bytes received (copied once, then read), admitted or not. */
int envoy_dynamic_module_on_http_filter_request_body(void *filter, void *module, bool end_of_stream) {
  (void)end_of_stream;
  call *it = module;
  if (it && it->refused) return BODY_STOP_NO_BUFFER; /* answered by the edge: the rest goes nowhere */
  if (!it || !it->check_body) return CONTINUE;
  it->check_body = false;
  uint8_t head[5 + 16 + ADMISSION_NAME_MAX + 16];
  size_t have = 0, count = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, BODY_RECEIVED_REQUEST);
  dm_buffer few[8];
  dm_buffer *chunks = count <= 8 ? few : calloc(count, sizeof(dm_buffer));
  if (!chunks) return CONTINUE;
  if (count && envoy_dynamic_module_callback_http_get_body_chunks(filter, BODY_RECEIVED_REQUEST, chunks))
    for (size_t i = 0; i < count && have < sizeof head; i++) { /* the head only: copied once, then read */
      size_t take = chunks[i].length < sizeof head - have ? chunks[i].length : sizeof head - have;
      if (take) memcpy(head + have, chunks[i].ptr, take);
      have += take;
    }
  if (chunks != few) free(chunks);
  const char *name = NULL;
  size_t length = 0;
  if (admission_model_from_grpc(head, have, &name, &length) && !admit(filter, it, name, length))
    return BODY_STOP_NO_BUFFER;
  return CONTINUE;
}
int envoy_dynamic_module_on_http_filter_request_trailers(void *f, void *m) {
  (void)f;
  return m && ((call *)m)->refused ? STOP : CONTINUE; /* answered by the edge: the rest goes nowhere */
}
int envoy_dynamic_module_on_http_filter_response_body(void *f, void *m, bool e) {
  (void)f, (void)m, (void)e;
  return CONTINUE;
}
int envoy_dynamic_module_on_http_filter_response_trailers(void *f, void *m) { (void)f, (void)m; return CONTINUE; }
void envoy_dynamic_module_on_http_filter_stream_complete(void *f, void *m) { (void)f, (void)m; }
