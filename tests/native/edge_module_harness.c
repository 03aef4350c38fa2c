/* Envoy's side of the edge's checks module (server/edge/checks_module.c), under AddressSanitizer and UBSan: the
 * ABI's callbacks over one request at a time, its body cut into chunks of exactly their length (a read past one is
 * caught), handed as Envoy hands them: all just received, part buffered and part received, one buffer seen as both,
 * or buffered and ended by trailers.
 *
 *   edge_module_harness CONFIG_FILE   one request per record on stdin: a line "METHOD_LEN PATH_LEN CE_COUNT CE_LEN
 *                                     HL_COUNT HL_LEN BODY_LEN CHUNK MODE REPLAY", then those bytes; the answer a line
 *                                     of five hex fields: STATUS (0: passed on), the x-edge-read header, the
 *                                     traffic:request and traffic:values metadata, and the refusal's body. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_module.h"

extern const char *envoy_dynamic_module_on_program_init(void);
extern void *envoy_dynamic_module_on_http_filter_config_new(void *envoy_config, dm_buffer name, dm_buffer text);
extern void envoy_dynamic_module_on_http_filter_config_destroy(void *c);
extern void *envoy_dynamic_module_on_http_filter_new(void *c, void *filter);
extern int envoy_dynamic_module_on_http_filter_request_headers(void *filter, void *module, bool end_of_stream);
extern int envoy_dynamic_module_on_http_filter_request_body(void *filter, void *module, bool end_of_stream);
extern int envoy_dynamic_module_on_http_filter_request_trailers(void *filter, void *module);
extern int envoy_dynamic_module_on_http_filter_response_headers(void *filter, void *module, bool end_of_stream);
extern void envoy_dynamic_module_on_http_filter_stream_complete(void *filter, void *module);
extern void envoy_dynamic_module_on_http_filter_destroy(void *module);

enum { RECEIVED = 0, SPLIT = 1, SAME = 2, TRAILERS = 3 };

typedef struct {
  char *data;
  size_t length, count;
} field;

static field method, path, encoding, header_length;
static bool replay;
static char **chunks;
static size_t *lengths, chunk_count, buffered; /* chunks [0, buffered) buffered, the rest received */
static bool same;                             /* the buffered body is the received one */
static unsigned status;
static field answer, echo, md_request, md_values;
static int FILTER;                            /* its address stands for Envoy's filter */

static void keep(field *f, const char *data, size_t length) {
  free(f->data);
  f->data = malloc(length ? length : 1);
  memcpy(f->data, data, length);
  f->length = length;
}

static field *named(dm_buffer key) {
  static const struct {
    const char *name;
    field *f;
  } known[] = {{":method", &method}, {":path", &path}, {"content-encoding", &encoding},
               {"inference-header-content-length", &header_length}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (key.length == strlen(known[i].name) && memcmp(key.ptr, known[i].name, key.length) == 0) return known[i].f;
  return NULL;
}

bool envoy_dynamic_module_callback_http_get_header(void *filter, int header_type, dm_buffer key, dm_buffer *result,
                                                   size_t index, size_t *count) {
  if (filter != &FILTER || header_type != HEADER_REQUEST) abort();
  static const char replay_name[] = "x-traffic-replay";
  if (key.length == sizeof replay_name - 1 && memcmp(key.ptr, replay_name, key.length) == 0) {
    if (count) *count = replay;
    if (replay) *result = (dm_buffer){"1", 1};
    return replay;
  }
  field *f = named(key);
  if (f == NULL || f->count == 0 || index >= f->count) {
    if (count) *count = f ? f->count : 0;
    return false;
  }
  if (count) *count = f->count;
  *result = (dm_buffer){f->data, f->length};
  return true;
}

size_t envoy_dynamic_module_callback_http_get_body_chunks_size(void *filter, int body_type) {
  if (filter != &FILTER) abort();
  if (same) return chunk_count;
  return body_type == 1 ? buffered : chunk_count - buffered;
}

bool envoy_dynamic_module_callback_http_get_body_chunks(void *filter, int body_type, dm_buffer *out) {
  size_t first = same || body_type == 1 ? 0 : buffered;
  size_t n = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, body_type);
  for (size_t i = 0; i < n; i++) out[i] = (dm_buffer){chunks[first + i], lengths[first + i]};
  return true;
}

void envoy_dynamic_module_callback_http_send_response(void *filter, uint32_t code, dm_header *headers, size_t count,
                                                      dm_buffer body, dm_buffer details) {
  if (filter != &FILTER || status != 0) abort(); /* one answer a request */
  (void)headers, (void)count, (void)details;
  status = code;
  keep(&answer, body.ptr, body.length);
}

bool envoy_dynamic_module_callback_http_set_header(void *filter, int header_type, dm_buffer key, dm_buffer value) {
  if (filter != &FILTER || header_type != HEADER_RESPONSE || key.length != 11) abort();
  keep(&echo, value.ptr, value.length);
  return true;
}

void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(void *filter, dm_buffer ns, dm_buffer key,
                                                                    dm_buffer value) {
  if (filter != &FILTER || ns.length != 7 || memcmp(ns.ptr, "traffic", 7) != 0) abort();
  keep(key.length == 7 && memcmp(key.ptr, "request", 7) == 0 ? &md_request : &md_values, value.ptr, value.length);
}

static char *read_exactly(size_t n) {
  char *bytes = malloc(n ? n : 1);
  if (n && fread(bytes, 1, n, stdin) != n) exit(4);
  return bytes;
}

static void put_hex(const field *f) {
  for (size_t i = 0; i < f->length; i++) printf("%02x", (unsigned char)f->data[i]);
}

static void take(field *f, size_t length, size_t count) {
  free(f->data);
  f->data = read_exactly(length);
  f->length = length, f->count = count;
}

/* One request through the module as Envoy drives it; the module's answers are in the globals. */
static void drive(void *config, const char *body, size_t body_len, size_t chunk, int mode) {
  chunk_count = 0;
  for (size_t at = 0; at < body_len; at += chunk) chunk_count++;
  chunks = calloc(chunk_count ? chunk_count : 1, sizeof *chunks);
  lengths = calloc(chunk_count ? chunk_count : 1, sizeof *lengths);
  for (size_t i = 0, at = 0; i < chunk_count; i++, at += chunk) {
    lengths[i] = body_len - at < chunk ? body_len - at : chunk;
    chunks[i] = malloc(lengths[i]);
    memcpy(chunks[i], body + at, lengths[i]);
  }
  same = mode == SAME;
  buffered = mode == SPLIT ? chunk_count / 2 : mode == TRAILERS ? chunk_count : 0;
  void *module = envoy_dynamic_module_on_http_filter_new(config, &FILTER);
  int done = envoy_dynamic_module_on_http_filter_request_headers(&FILTER, module, body_len == 0);
  if (body_len && status == 0) {
    if (done != STOP) abort(); /* a request with a body waits for it */
    if (mode == TRAILERS) {
      size_t all = buffered;
      buffered = 0; /* the last body call: nothing buffered yet, the chunks just received, no end */
      if (envoy_dynamic_module_on_http_filter_request_body(&FILTER, module, false) != 1) abort();
      buffered = all;
      done = envoy_dynamic_module_on_http_filter_request_trailers(&FILTER, module);
    } else {
      done = envoy_dynamic_module_on_http_filter_request_body(&FILTER, module, true);
    }
  }
  if ((status == 0) != (done == CONTINUE)) abort(); /* passed on exactly where not answered */
  if (status == 0) envoy_dynamic_module_on_http_filter_response_headers(&FILTER, module, false);
  envoy_dynamic_module_on_http_filter_stream_complete(&FILTER, module);
  envoy_dynamic_module_on_http_filter_destroy(module);
  for (size_t i = 0; i < chunk_count; i++) free(chunks[i]);
  free(chunks);
  free(lengths);
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  FILE *f = fopen(argv[1], "rb");
  if (f == NULL) return 2;
  char *text = malloc(1 << 22);
  size_t n = fread(text, 1, (1 << 22) - 1, f);
  fclose(f);
  if (strcmp(envoy_dynamic_module_on_program_init(), ABI_VERSION) != 0) return 5;
  void *config = envoy_dynamic_module_on_http_filter_config_new(NULL, (dm_buffer){"edge_checks", 11},
                                                                (dm_buffer){text, n});
  free(text);
  if (config == NULL) return 6;
  size_t method_len, path_len, ce_len, hl_len, body_len, chunk;
  int ce_count, hl_count, mode, replayed;
  while (scanf("%zu %zu %d %zu %d %zu %zu %zu %d %d", &method_len, &path_len, &ce_count, &ce_len, &hl_count,
               &hl_len, &body_len, &chunk, &mode, &replayed) == 10) {
    if (getchar() != '\n' || chunk == 0 || mode < RECEIVED || mode > TRAILERS) return 3;
    take(&method, method_len, 1);
    take(&path, path_len, 1);
    take(&encoding, ce_len, (size_t)ce_count);
    take(&header_length, hl_len, (size_t)hl_count);
    char *body = read_exactly(body_len);
    replay = replayed != 0;
    status = 0;
    answer.length = echo.length = md_request.length = md_values.length = 0;
    drive(config, body, body_len, chunk, mode);
    free(body);
    printf("%u\t", status);
    put_hex(&echo);
    putchar('\t');
    put_hex(&md_request);
    putchar('\t');
    put_hex(&md_values);
    putchar('\t');
    put_hex(&answer);
    putchar('\n');
    fflush(stdout);
  }
  envoy_dynamic_module_on_http_filter_config_destroy(config);
  field *all[] = {&method, &path, &encoding, &header_length, &answer, &echo, &md_request, &md_values};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->data);
  return 0;
}
