/* The HTTP request checks where Envoy fronts the servers (`--front envoy`, clusters, TLS, recording): an Envoy
 * dynamic module over the same C that runs inside tritonserver's reads (server/triton/front/http_checks.c), so a
 * request is read by one implementation whichever front takes it.
 *
 * Envoy's buffer filter runs before this one and caps the body (413); a request's whole body then arrives in one
 * call. It is copied once into one buffer, and the checks read that copy. A refused request gets the status and
 * why as JSON ({"error": ...}, header x-edge: refused) and goes no further.
 *
 * Configuration (server/edge/request_checks.py writes it): "echo 0|1", "record 0|1", "values 0|1",
 * "value_bytes N" lines, then "rules" and the rules' JSON (request_checks.checks_json) to the end.
 *   echo    tests only: what the checks read of each input comes back as response header x-edge-read;
 *   record  every inference request's model, version, inputs and batch go into dynamic metadata traffic:request
 *           (JSON text), for the access log of a recording (server/edge/recording.py); refused ones with no inputs;
 *   values  and its body (base64, up to value_bytes) into traffic:values.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envoy_module.h"
#include "../triton/front/http_checks.h" /* the checks: one implementation for both fronts */

extern void envoy_dynamic_module_callback_http_send_response(void *filter, uint32_t status, dm_header *headers,
                                                             size_t count, dm_buffer body, dm_buffer details);
extern bool envoy_dynamic_module_callback_http_set_header(void *filter, int header_type, dm_buffer key,
                                                          dm_buffer value);
extern void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(void *filter, dm_buffer ns,
                                                                           dm_buffer key, dm_buffer value);

enum { BODY_BUFFERED_REQUEST = 1 };                 /* envoy_dynamic_module_type_http_body_type_BufferedRequestBody */
enum { BODY_STOP_AND_BUFFER = 1, BODY_STOP = 3 };  /* ..._request_body_status: StopIterationAndBuffer, NoBuffer */
enum { MAX_RECORDED_INPUTS = 64, MAX_RECORDED_NAME = 256 }; /* past them the request goes on unrecorded */

#define REPLAY_HEADER "x-traffic-replay" /* a replay's requests carry it (common/traffic.py: REPLAY_HEADER) */
#define METADATA "traffic"

typedef struct {
  struct check_rules *rules;
  bool echo, record, values;
  size_t value_bytes;
} config;

typedef struct { /* a growing text: the traffic line being written */
  char *data;
  size_t length, capacity;
  bool failed;
} text;

typedef struct {
  config *config;
  bool checked;
  char *reading; /* echo: what the checks read, for the response's headers */
  text inputs;   /* record: the line's inputs, as the checks pass them */
  size_t recorded;
  long max_batch_size;
  int64_t batch;
} request;

/* ---- text ---- */

static void add(text *t, const char *bytes, size_t n) {
  if (t->failed) return;
  if (n > SIZE_MAX / 2 - t->length) {
    t->failed = true;
    return;
  }
  if (t->length + n + 1 > t->capacity) {
    size_t want = (t->length + n + 1) * 2;
    char *grown = realloc(t->data, want);
    if (grown == NULL) {
      t->failed = true;
      return;
    }
    t->data = grown, t->capacity = want;
  }
  memcpy(t->data + t->length, bytes, n);
  t->length += n;
  t->data[t->length] = '\0';
}

static void add_text(text *t, const char *s) { add(t, s, strlen(s)); }

/* s as a JSON string: quotes, backslashes and control bytes escaped as \u00XX; other bytes as they are */
static void add_json_string(text *t, const char *s, size_t n) {
  add(t, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)s[i];
    if (b < 0x20 || b == 0x7f || b == '"' || b == '\\') {
      char escaped[8];
      snprintf(escaped, sizeof escaped, "\\u%04x", b);
      add(t, escaped, 6);
    } else {
      add(t, s + i, 1);
    }
  }
  add(t, "\"", 1);
}

static void add_base64(text *t, const unsigned char *bytes, size_t n) {
  char block[BASE64_LENGTH(BASE64_BLOCK)];
  for (size_t i = 0; i < n; i += BASE64_BLOCK)
    add(t, block, module_base64(bytes + i, n - i < BASE64_BLOCK ? n - i : BASE64_BLOCK, block));
}

/* ---- configuration ---- */

static bool flag(const char **at, const char *end, const char *name, size_t *value) {
  size_t n = strlen(name);
  if ((size_t)(end - *at) <= n || memcmp(*at, name, n) != 0 || (*at)[n] != ' ') return false;
  const char *p = *at + n + 1;
  size_t v = 0;
  while (p < end && *p >= '0' && *p <= '9') {
    if (v > (SIZE_MAX - 9) / 10) return false;
    v = v * 10 + (size_t)(*p++ - '0');
  }
  if (p >= end || *p != '\n') return false;
  *value = v, *at = p + 1;
  return true;
}

static config *read_config(const char *text_in, size_t length) {
  config *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  const char *at = text_in, *end = text_in + length;
  size_t v;
  for (bool more = true; more;) {
    more = false;
    if (flag(&at, end, "echo", &v)) c->echo = v != 0, more = true;
    else if (flag(&at, end, "record", &v)) c->record = v != 0, more = true;
    else if (flag(&at, end, "values", &v)) c->values = v != 0, more = true;
    else if (flag(&at, end, "value_bytes", &v)) c->value_bytes = v, more = true;
  }
  static const char rules[] = "rules\n";
  char why[256];
  if ((size_t)(end - at) < sizeof rules - 1 || memcmp(at, rules, sizeof rules - 1) != 0 ||
      (c->rules = check_rules_load(at + sizeof rules - 1, (size_t)(end - at) - (sizeof rules - 1), why,
                                   sizeof why)) == NULL) {
    fprintf(stderr, "edge checks: a configuration this module cannot read (server/edge/request_checks.py)\n");
    free(c);
    return NULL;
  }
  return c;
}

/* ---- one request ---- */

/* The refusal: status, and why as JSON ({"error": ...}, its quotes, backslashes and control bytes as spaces). */
static void refuse(void *filter, int status, const char *why) {
  char body[CHECK_WHY + 16];
  size_t n = 10;
  memcpy(body, "{\"error\":\"", n);
  for (const char *w = why; *w && n < sizeof body - 3; w++) {
    unsigned char b = (unsigned char)*w;
    body[n++] = b < 0x20 || b == 0x7f || b == '"' || b == '\\' ? ' ' : (char)b;
  }
  body[n++] = '"', body[n++] = '}';
  dm_header headers[] = {{"content-type", 12, "application/json", 16}, {"x-edge", 6, "refused", 7}};
  static const char details[] = "edge_checks_refused";
  envoy_dynamic_module_callback_http_send_response(filter, (uint32_t)status, headers, 2, (dm_buffer){body, n},
                                                   (dm_buffer){details, sizeof details - 1});
}

static dm_buffer header(void *filter, const char *name, size_t *count) {
  dm_buffer value = {0};
  size_t n = 0;
  if (!envoy_dynamic_module_callback_http_get_header(filter, HEADER_REQUEST, (dm_buffer){name, strlen(name)}, &value,
                                                     0, &n))
    value = (dm_buffer){0};
  if (count) *count = n;
  return value;
}

/* The model and version of an inference path (/v2/models/M[/versions/V]/infer); false for any other path. */
static bool infer_path(dm_buffer path, dm_buffer *model, dm_buffer *version) {
  static const char prefix[] = "/v2/models/", infer[] = "/infer", versions[] = "/versions/";
  size_t np = sizeof prefix - 1, ni = sizeof infer - 1, nv = sizeof versions - 1;
  if (path.ptr == NULL || path.length < np + 1 + ni || memcmp(path.ptr, prefix, np) != 0 ||
      memcmp(path.ptr + path.length - ni, infer, ni) != 0)
    return false;
  const char *name = path.ptr + np, *stop = path.ptr + path.length - ni;
  const char *p = name;
  while (p < stop && *p != '/') {
    char ch = *p;
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
          ch == '.' || ch == '-'))
      return false;
    p++;
  }
  if (p == name) return false;
  *model = (dm_buffer){name, (size_t)(p - name)};
  *version = (dm_buffer){NULL, 0};
  if (p == stop) return true;
  if ((size_t)(stop - p) <= nv || memcmp(p, versions, nv) != 0) return false;
  const char *digits = p + nv;
  for (const char *d = digits; d < stop; d++)
    if (*d < '0' || *d > '9') return false;
  *version = (dm_buffer){digits, (size_t)(stop - digits)};
  return true;
}

static void seen(void *arg, const struct check_input_seen *input) {
  request *r = arg;
  if (r->recorded >= MAX_RECORDED_INPUTS || input->name_len > MAX_RECORDED_NAME) {
    r->inputs.failed = true; /* recording refuses nothing: the request goes on unrecorded */
    return;
  }
  if (r->recorded == 0 && r->max_batch_size > 0 && input->rank > 0) r->batch = input->dims[0];
  add_text(&r->inputs, r->recorded++ ? ",[" : "[");
  add_json_string(&r->inputs, input->name, input->name_len);
  add_text(&r->inputs, ",");
  add_json_string(&r->inputs, input->datatype, input->datatype_len);
  add_text(&r->inputs, ",[");
  for (int i = 0; i < input->rank; i++) {
    char dim[32];
    int n = snprintf(dim, sizeof dim, "%s%lld", i ? "," : "", (long long)input->dims[i]);
    add(&r->inputs, dim, (size_t)n);
  }
  add_text(&r->inputs, "]]");
}

static void set_metadata(void *filter, const char *key, const text *value) {
  envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
      filter, (dm_buffer){METADATA, sizeof METADATA - 1}, (dm_buffer){key, strlen(key)},
      (dm_buffer){value->data, value->length});
}

/* The traffic line's request part (common/traffic.py reads it): model, version, inputs (none where refused), batch. */
static void record(void *filter, request *r, dm_buffer model, dm_buffer version, bool passed, const char *body,
                   size_t body_len, size_t header_length) {
  if (passed && r->inputs.failed) return;
  text line = {0};
  add_text(&line, "{\"model\":");
  add_json_string(&line, model.ptr, model.length);
  add_text(&line, ",\"version\":");
  add_json_string(&line, version.ptr ? version.ptr : "", version.length);
  add_text(&line, ",\"inputs\":[");
  if (passed && r->inputs.length) add(&line, r->inputs.data, r->inputs.length);
  char batch[48];
  snprintf(batch, sizeof batch, "],\"batch\":%lld", passed ? (long long)r->batch : 1LL);
  add_text(&line, batch);
  size_t replays;
  header(filter, REPLAY_HEADER, &replays);
  add_text(&line, replays ? ",\"replayed\":true}" : "}");
  if (!line.failed) set_metadata(filter, "request", &line);
  free(line.data);
  if (!passed || !r->config->values || body_len > r->config->value_bytes) return;
  text values = {0};
  add_text(&values, "{\"body\":\"");
  add_base64(&values, (const unsigned char *)body, body_len);
  char tail[48];
  snprintf(tail, sizeof tail, "\",\"header_length\":%zu}", header_length);
  add_text(&values, tail);
  if (!values.failed) set_metadata(filter, "values", &values);
  free(values.data);
}


/* The whole request through the checks; true where it passes. body: the module's own copy (or NULL). */
static bool check(void *filter, request *r, const char *body, size_t body_len) {
  size_t method_count, path_count, encoding_count, length_count;
  dm_buffer method = header(filter, ":method", &method_count);
  dm_buffer path = header(filter, ":path", &path_count);
  dm_buffer encoding = header(filter, "content-encoding", &encoding_count);
  dm_buffer header_length = header(filter, "inference-header-content-length", &length_count);
  dm_buffer model = {0}, version = {0};
  bool recorded = r->config->record && infer_path(path, &model, &version);
  if (recorded) r->max_batch_size = check_max_batch_size(r->config->rules, model.ptr, model.length);
  r->batch = 1;
  struct check_request checked = {
      .method = method.ptr ? method.ptr : "",
      .method_len = method.length,
      .path = path.ptr ? path.ptr : "",
      .path_len = path.length,
      .content_encoding = encoding_count ? encoding.ptr : NULL,
      .content_encoding_len = encoding.length,
      .content_encoding_count = encoding_count > 1 ? 2 : (int)encoding_count,
      .header_length = length_count ? header_length.ptr : NULL,
      .header_length_len = header_length.length,
      .header_length_count = length_count > 1 ? 2 : (int)length_count,
      .body = body ? body : "",
      .body_len = body_len,
      .seen = recorded ? seen : NULL,
      .seen_arg = r,
  };
  struct check_verdict verdict;
  check_http_request(r->config->rules, &checked, &verdict);
  bool passed = verdict.status == 0;
  if (recorded) {
    size_t declared = 0; /* where it passed, the checks held the header to at most 9 plain digits */
    for (size_t i = 0; passed && i < header_length.length; i++) declared = declared * 10 + (size_t)(header_length.ptr[i] - '0');
    record(filter, r, model, version, passed, body, body_len, declared);
  }
  if (!passed) refuse(filter, verdict.status, verdict.why);
  else if (r->config->echo && verdict.reading[0]) r->reading = strdup(verdict.reading);
  return passed;
}

/* The body as one buffer, copied once from Envoy's chunks: the buffered ones, then the ones just received (where
 * they are not the same buffer). NULL with *length 0 for no body; NULL with *length SIZE_MAX on a failure. */
static char *whole_body(void *filter, size_t *length) {
  int kinds[2] = {BODY_BUFFERED_REQUEST, BODY_RECEIVED_REQUEST};
  size_t counts[2];
  dm_buffer *chunks[2] = {NULL, NULL};
  size_t total = 0;
  char *body = NULL;
  *length = SIZE_MAX;
  for (int k = 0; k < 2; k++) {
    counts[k] = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, kinds[k]);
    if (counts[k] == 0) continue;
    if (counts[k] > SIZE_MAX / sizeof(dm_buffer) || (chunks[k] = malloc(counts[k] * sizeof(dm_buffer))) == NULL ||
        !envoy_dynamic_module_callback_http_get_body_chunks(filter, kinds[k], chunks[k]))
      goto done;
  }
  if (counts[0] && counts[0] == counts[1] && chunks[0][0].ptr == chunks[1][0].ptr) counts[0] = 0; /* one buffer */
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < counts[k]; i++) {
      if (chunks[k][i].length > SIZE_MAX - 1 - total) goto done;
      total += chunks[k][i].length;
    }
  if (total == 0) {
    *length = 0;
    goto done;
  }
  if ((body = malloc(total)) == NULL) goto done;
  size_t at = 0;
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < counts[k]; i++) {
      memcpy(body + at, chunks[k][i].ptr, chunks[k][i].length);
      at += chunks[k][i].length;
    }
  *length = total;
done:
  free(chunks[0]);
  free(chunks[1]);
  return body;
}

/* ---- Envoy's hooks ---- */

const char *envoy_dynamic_module_on_program_init(void) { return ABI_VERSION; }

void *envoy_dynamic_module_on_http_filter_config_new(void *envoy_config, dm_buffer name, dm_buffer text_in) {
  (void)envoy_config, (void)name;
  return read_config(text_in.ptr, text_in.length);
}

void envoy_dynamic_module_on_http_filter_config_destroy(void *c) {
  config *it = c;
  if (it == NULL) return;
  check_rules_free(it->rules);
  free(it);
}

void *envoy_dynamic_module_on_http_filter_new(void *c, void *filter) {
  (void)filter;
  request *r = calloc(1, sizeof *r);
  if (r != NULL) r->config = c;
  return r;
}

int envoy_dynamic_module_on_http_filter_request_headers(void *filter, void *module, bool end_of_stream) {
  request *r = module;
  if (r == NULL) return refuse(filter, 503, "the edge is out of memory: try again"), STOP;
  if (!end_of_stream) return STOP; /* the body follows: the checks read it whole */
  r->checked = true;
  return check(filter, r, NULL, 0) ? CONTINUE : STOP;
}

/* The request, its body whole, through the checks once: true where it passes (a refusal is sent). */
static bool check_with_body(void *filter, request *r) {
  r->checked = true;
  size_t length;
  char *body = whole_body(filter, &length);
  if (length == SIZE_MAX) {
    refuse(filter, 503, "the edge could not read the body: try again");
    return false;
  }
  bool passed = check(filter, r, body, length);
  free(body);
  return passed;
}

int envoy_dynamic_module_on_http_filter_request_body(void *filter, void *module, bool end_of_stream) {
  request *r = module;
  if (r == NULL) return BODY_STOP; /* refused at its headers */
  if (!end_of_stream) return BODY_STOP_AND_BUFFER;
  return check_with_body(filter, r) ? CONTINUE : BODY_STOP;
}

/* Trailers end a stream whose last body call did not: the request is checked here, its body whole. */
int envoy_dynamic_module_on_http_filter_request_trailers(void *filter, void *module) {
  request *r = module;
  if (r == NULL) return STOP; /* refused at its headers */
  if (r->checked) return CONTINUE;
  return check_with_body(filter, r) ? CONTINUE : STOP;
}

int envoy_dynamic_module_on_http_filter_response_headers(void *filter, void *module, bool end_of_stream) {
  (void)end_of_stream;
  request *r = module;
  if (r != NULL && r->reading != NULL)
    envoy_dynamic_module_callback_http_set_header(filter, HEADER_RESPONSE, (dm_buffer){"x-edge-read", 11},
                                                  (dm_buffer){r->reading, strlen(r->reading)});
  return CONTINUE;
}

int envoy_dynamic_module_on_http_filter_response_body(void *filter, void *module, bool end_of_stream) {
  (void)filter, (void)module, (void)end_of_stream;
  return CONTINUE;
}

int envoy_dynamic_module_on_http_filter_response_trailers(void *filter, void *module) {
  (void)filter, (void)module;
  return CONTINUE;
}

int envoy_dynamic_module_on_http_filter_local_reply(void *f, void *m, uint32_t code, dm_buffer details, bool reset) {
  (void)f, (void)m, (void)code, (void)details, (void)reset;
  return CONTINUE;
}

void envoy_dynamic_module_on_http_filter_stream_complete(void *filter, void *module) { (void)filter, (void)module; }

void envoy_dynamic_module_on_http_filter_destroy(void *module) {
  request *r = module;
  if (r == NULL) return;
  free(r->reading);
  free(r->inputs.data);
  free(r);
}
