/* Telling the server which calls nobody waits for: an Envoy dynamic module (Envoy 1.40, ABI v0.2) on both listeners.
 *
 * tritonserver 2.51 must never learn that a gRPC call was cancelled (its frontend crashes on a call cancelled as
 * it completes; server/triton_guard.c), so a cancelled call would be computed in full. This filter gives every
 * call an id of its own, x-edge-call (16 hex digits from the system's random source; a client's own header of
 * that name is replaced), which tritonserver passes to the model as a request parameter
 * (--grpc-header-forward-pattern / --http-header-forward-pattern). When a call ends at the edge without an
 * answer (the client cancelled it, hung up or timed out), its id goes into the cancelled-calls table: a file of
 * the server's state folder (0600) that the models map, slot id % CANCEL_SLOTS holding the id. A model checks
 * its requests' ids before computing and answers a cancelled one at once (triton_models/cancelled_calls.py):
 * what nobody waits for costs a lookup, not a run.
 *
 * Beside it, a refusal for overload (HTTP 503, gRPC UNAVAILABLE answered at once: a full queue) gets a retry hint:
 * Retry-After: 1, grpc-retry-pushback-ms: 1000.
 *
 * Configuration: "table hex(path)". The table is made by the launcher (server/cancel_table.py). */
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
#include <unistd.h>

typedef struct {
  const char *ptr;
  size_t length;
} dm_buffer;

enum { HEADER_REQUEST = 0, HEADER_RESPONSE = 2, CONTINUE = 0, CANCEL_SLOTS = 1 << 18 };

extern bool envoy_dynamic_module_callback_http_set_header(void *filter, int header_type, dm_buffer key,
                                                          dm_buffer value);
extern bool envoy_dynamic_module_callback_http_get_header(void *filter, int header_type, dm_buffer key,
                                                          dm_buffer *result, size_t index, size_t *count);

#define ABI_VERSION "v0.2.0"
#define HEADER "x-edge-call"

typedef struct {
  uint64_t *slots; /* CANCEL_SLOTS ids, mapped from the table file */
} config;

typedef struct {
  config *config;
  uint64_t id;   /* 0: no call of ours (no id given) */
  bool answered; /* a response (the server's or the edge's own) began */
} call;

static int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* The path of "table <hex>" as text (NULL: not that, or out of memory). */
static char *table_path(const char *text, size_t length) {
  static const char key[] = "table ";
  size_t k = sizeof key - 1;
  if (length < k || memcmp(text, key, k) != 0) return NULL;
  size_t digits = length - k;
  while (digits && (text[k + digits - 1] == '\n' || text[k + digits - 1] == ' ')) digits--;
  if (digits == 0 || digits % 2) return NULL;
  char *path = malloc(digits / 2 + 1);
  if (!path) return NULL;
  for (size_t i = 0; i < digits / 2; i++) {
    int high = hex_value(text[k + 2 * i]), low = hex_value(text[k + 2 * i + 1]);
    if (high < 0 || low < 0) return free(path), NULL;
    path[i] = (char)(high << 4 | low);
  }
  path[digits / 2] = 0;
  return path;
}

static config *open_table(const char *path) {
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return NULL;
  struct stat st;
  size_t bytes = (size_t)CANCEL_SLOTS * sizeof(uint64_t);
  void *map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077) && (size_t)st.st_size == bytes)
    map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return NULL;
  config *c = malloc(sizeof *c);
  if (!c) return munmap(map, bytes), NULL;
  c->slots = map;
  return c;
}

const char *envoy_dynamic_module_on_program_init(void) { return ABI_VERSION; }

void *envoy_dynamic_module_on_http_filter_config_new(void *envoy_config, dm_buffer name, dm_buffer text) {
  (void)envoy_config;
  if (name.length != 13 || memcmp(name.ptr, "cancel_notice", 13) != 0) return NULL;
  char *path = table_path(text.ptr, text.length);
  if (!path) return NULL;
  config *c = open_table(path); /* NULL: Envoy refuses the configuration, saying so */
  free(path);
  return c;
}

void envoy_dynamic_module_on_http_filter_config_destroy(void *c) {
  config *conf = c;
  if (!conf) return;
  munmap(conf->slots, (size_t)CANCEL_SLOTS * sizeof(uint64_t));
  free(conf);
}

void *envoy_dynamic_module_on_http_filter_new(void *c, void *filter) {
  (void)filter;
  call *it = calloc(1, sizeof *it);
  if (it) it->config = c;
  return it;
}

int envoy_dynamic_module_on_http_filter_request_headers(void *filter, void *module, bool end_of_stream) {
  (void)end_of_stream;
  call *it = module;
  if (!it) return CONTINUE;
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
  if (it->id && !it->answered && it->config) /* nobody waits for this call any more */
    __atomic_store_n(&it->config->slots[it->id % CANCEL_SLOTS], it->id, __ATOMIC_RELAXED);
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
void envoy_dynamic_module_on_http_filter_scheduled(void *f, void *m, uint64_t id) { (void)f, (void)m, (void)id; }
void envoy_dynamic_module_on_http_filter_config_scheduled(void *c, uint64_t id) { (void)c, (void)id; }
void envoy_dynamic_module_on_http_filter_http_callout_done(void *f, void *m, uint64_t id, int result, void *headers,
                                                           size_t nheaders, void *body, size_t nbody) {
  (void)f, (void)m, (void)id, (void)result, (void)headers, (void)nheaders, (void)body, (void)nbody;
}
void envoy_dynamic_module_on_http_filter_http_stream_headers(void *f, void *m, uint64_t id, void *h, size_t n,
                                                             bool e) {
  (void)f, (void)m, (void)id, (void)h, (void)n, (void)e;
}
void envoy_dynamic_module_on_http_filter_http_stream_data(void *f, void *m, uint64_t id, const void *d, size_t n,
                                                          bool e) {
  (void)f, (void)m, (void)id, (void)d, (void)n, (void)e;
}
void envoy_dynamic_module_on_http_filter_http_stream_trailers(void *f, void *m, uint64_t id, void *t, size_t n) {
  (void)f, (void)m, (void)id, (void)t, (void)n;
}
void envoy_dynamic_module_on_http_filter_http_stream_complete(void *f, void *m, uint64_t id) {
  (void)f, (void)m, (void)id;
}
void envoy_dynamic_module_on_http_filter_http_stream_reset(void *f, void *m, uint64_t id, int reason) {
  (void)f, (void)m, (void)id, (void)reason;
}
void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(void *f, void *m) {
  (void)f, (void)m;
}
void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(void *f, void *m) {
  (void)f, (void)m;
}
void *envoy_dynamic_module_on_http_filter_per_route_config_new(dm_buffer name, dm_buffer text) {
  (void)name, (void)text;
  return NULL;
}
void envoy_dynamic_module_on_http_filter_per_route_config_destroy(void *c) { (void)c; }
