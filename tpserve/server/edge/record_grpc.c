/* Recording gRPC ModelInfer requests at the edge, natively: an Envoy dynamic module (Envoy 1.40, ABI v0.2).
 *
 * It reads the request's model, version, each input's name, datatype and shape, and its batch (HTTP's are read
 * by the checks module, checks_module.c, from the checks' own reading). With a "log" line in its configuration
 * it writes each request's line to the recording itself when the stream completes (common/traffic.py's format:
 * the request, its arrival in µs, bytes received, gRPC status and duration), through a buffer that a thread of
 * its own writes out every second or every 64 KB, reopening the file where the keeper has rotated it. That costs
 * Envoy 10-20 µs a gRPC request where the metadata and the access log cost 41-44 (docs/measuring.md). Without
 * it, the request goes as one JSON text under the dynamic metadata key traffic/request, for an access log.
 * With "values N" (RECORD=values) it also keeps each request's message, up to N bytes, as it passes, and writes
 * it into the line (base64, as "values": {"body", "header_length": 0}) where the body was one whole
 * uncompressed message within N; past N the copy is dropped at once and the line has the shapes alone.
 *
 * Why native: a Lua filter cost about 10% of gRPC throughput on a 0.3 ms model (2 cores), most of it in running
 * a Lua filter on the stream at all, and keeping values in Lua needed the stream buffered whole first. This
 * filter never holds the stream: every hook answers Continue, and the body passes on as it comes. It copies a
 * message's first 512 bytes (and, where the inputs run past them, up to head_bytes) and never the tensor
 * contents behind them, except where values are kept.
 *
 * Reading: the message is walked field by field; a length-delimited field that runs past the bytes copied ends
 * the walk. That is fine at outputs (6) or the raw contents (7), since serializers write fields in number order,
 * so the inputs have been read. A message it cannot read, a compressed one, or one past 64 inputs, 64 dims or
 * 256-byte names goes on unrecorded: recording refuses nothing (Triton decides). Repeated scalar fields are read
 * as protobuf reads them: the last one wins.
 *
 * Built by `make install` (python -m tpserve.server build-shim) into .tools/envoy_modules/ (0700). The ABI's types and
 * the callbacks used are declared below as the ABI defines them (source/extensions/dynamic_modules/abi/abi.h
 * of Envoy); the ABI keeps v0.x modules working one minor version on.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "envoy_module.h"

/* ---- the ABI, as far as this module uses it ---- */

extern void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(void *filter, dm_buffer ns,
                                                                           dm_buffer key, dm_buffer value);


/* ---- configuration: "head_bytes N", then "values N" where bodies are kept (up to N bytes; needs the log), then
 * "log hex(path)" where the module writes the lines, then one "max_batch_size hex(model name)" line a model ---- */

#define HEAD_FIRST 512 /* a message's header is tried from its first bytes, before head_bytes */
#define MAX_ITEMS 64
#define MAX_NAME 256
#define MAX_VALUE_BYTES ((size_t)1 << 30) /* "values N" past this is refused: sizes below stay far from SIZE_MAX */
#define GRPC_INFER "/inference.GRPCInferenceService/ModelInfer"
#define REPLAY_HEADER "x-traffic-replay" /* a replay's requests carry it (common/traffic.py: REPLAY_HEADER) */

typedef struct {
  char *name;
  size_t length;
  long max_batch_size;
} model_rule;

typedef struct line_writer line_writer;

typedef struct {
  size_t head_bytes;
  bool values;        /* keep each request's message, up to value_bytes, for its line */
  size_t value_bytes;
  size_t count;
  model_rule *models;
  line_writer *log; /* NULL: the access log writes the line, from the dynamic metadata */
} config;

static line_writer *writer_start(const char *path);
static void writer_stop(line_writer *w);

static int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* "2f746d70" -> "/tmp", NUL-terminated and malloc'd; NULL: not hex, odd, or a NUL inside */
static char *hex_text(const char *hex) {
  size_t n = strlen(hex);
  char *text = n % 2 ? NULL : malloc(n / 2 + 1);
  if (!text) return NULL;
  for (size_t i = 0; i < n / 2; i++) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0 || hi * 16 + lo == 0) return free(text), NULL;
    text[i] = (char)(hi * 16 + lo);
  }
  text[n / 2] = 0;
  return text;
}

static void free_config(config *c) {
  if (!c) return;
  writer_stop(c->log); /* its last lines written first */
  for (size_t i = 0; i < c->count; i++) free(c->models[i].name);
  free(c->models);
  free(c);
}

static config *parse_config(const char *text, size_t length) {
  if (!text || length == 0) return NULL;
  config *c = calloc(1, sizeof(config));
  if (!c) return NULL;
  char *copy = malloc(length + 1);
  if (!copy) return free(c), NULL;
  memcpy(copy, text, length);
  copy[length] = 0;
  size_t lines = 1;
  for (size_t i = 0; i < length; i++) lines += copy[i] == '\n';
  c->models = calloc(lines, sizeof(model_rule));
  char *save = NULL, *line = strtok_r(copy, "\n", &save);
  bool ok = c->models && line && sscanf(line, "head_bytes %zu", &c->head_bytes) == 1 && c->head_bytes > 0;
  while (ok && (line = strtok_r(NULL, "\n", &save))) {
    if (strncmp(line, "values ", 7) == 0) {
      int at = 0;
      ok = !c->values && !c->log && c->count == 0 && sscanf(line, "values %zu%n", &c->value_bytes, &at) == 1 &&
           line[at] == 0 && line[7] >= '0' && line[7] <= '9' && c->value_bytes <= MAX_VALUE_BYTES;
      c->values = true;
      continue;
    }
    if (strncmp(line, "log ", 4) == 0) {
      char *path = NULL;
      ok = !c->log && c->count == 0 && (path = hex_text(line + 4)) != NULL && path[0] == '/';
      if (ok) ok = (c->log = writer_start(path)) != NULL;
      free(path);
      continue;
    }
    long batch;
    int at = 0;
    if (sscanf(line, "%ld %n", &batch, &at) != 1) { ok = false; break; }
    const char *hex = line + at;
    size_t n = strlen(hex);
    model_rule *rule = &c->models[c->count];
    rule->name = malloc(n / 2 + 1);
    if (rule->name) c->count++; /* owned by the config from here: freed with it */
    if (!rule->name || n % 2) { ok = false; break; }
    for (size_t i = 0; i < n / 2; i++) {
      int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) { ok = false; break; }
      rule->name[i] = (char)(hi * 16 + lo);
    }
    rule->length = n / 2;
    rule->max_batch_size = batch;
  }
  free(copy);
  if (ok && c->values && !c->log) ok = false; /* bodies go into the module's own lines only */
  if (!ok) return free_config(c), NULL;
  return c;
}

static long max_batch_of(const config *c, const char *name, size_t length) {
  for (size_t i = 0; i < c->count; i++)
    if (c->models[i].length == length && memcmp(c->models[i].name, name, length) == 0)
      return c->models[i].max_batch_size;
  return -1; /* not a model of ours: batch 1 */
}

/* ---- protobuf: just enough of ModelInferRequest (inference.proto) ---- */

typedef struct {
  const uint8_t *s;
  size_t a, b; /* [a, b) */
} span;

typedef struct {
  span name, datatype;
  int64_t dims[MAX_ITEMS];
  int ndims;
} tensor;

typedef struct {
  span model, version;
  tensor inputs[MAX_ITEMS];
  int ninputs;
} infer;

enum { READ_ERROR = -1, READ_MORE = 0, READ_DONE = 1 };

static bool varint(const uint8_t *s, size_t *pos, size_t end, uint64_t *value) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= end) return false;
    uint8_t byte = s[(*pos)++];
    v |= (uint64_t)(byte & 0x7f) << shift;
    if (byte < 0x80) return *value = v, true;
  }
  return false;
}

typedef int (*visit_fn)(const uint8_t *s, void *into, uint64_t number, int wire, uint64_t value, size_t a, size_t b);

/* Walk [pos, stop). cut: the bytes end at stop although the message goes on; a length-delimited field running
 * past stop ends the walk and its number goes to *stopped_at (0: the whole span was read). */
static int each_field(const uint8_t *s, size_t pos, size_t stop, bool cut, visit_fn visit, void *into,
                      uint64_t *stopped_at) {
  if (stopped_at) *stopped_at = 0;
  while (pos < stop) {
    uint64_t key, value;
    if (!varint(s, &pos, stop, &key)) return READ_ERROR;
    uint64_t number = key >> 3;
    int wire = (int)(key & 7);
    if (wire == 0) {
      if (!varint(s, &pos, stop, &value)) return READ_ERROR;
      if (visit(s, into, number, 0, value, 0, 0) < 0) return READ_ERROR;
    } else if (wire == 2) {
      if (!varint(s, &pos, stop, &value)) return READ_ERROR;
      if (value > stop - pos) {
        if (cut && stopped_at) return *stopped_at = number, READ_DONE;
        return READ_ERROR;
      }
      if (visit(s, into, number, 2, 0, pos, pos + value) < 0) return READ_ERROR;
      pos += value;
    } else if (wire == 1 || wire == 5) {
      pos += wire == 1 ? 8 : 4;
    } else {
      return READ_ERROR;
    }
  }
  return READ_DONE;
}

static int text(span *out, const uint8_t *s, size_t a, size_t b) {
  if (b - a > MAX_NAME) return -1;
  out->s = s, out->a = a, out->b = b;
  return 0;
}

static int add_dim(tensor *t, uint64_t value) {
  if (t->ndims >= MAX_ITEMS) return -1;
  t->dims[t->ndims++] = (int64_t)value;
  return 0;
}

static int visit_tensor(const uint8_t *s, void *into, uint64_t number, int wire, uint64_t value, size_t a, size_t b) {
  tensor *t = into;
  if (number == 1 && wire == 2) return text(&t->name, s, a, b);
  if (number == 2 && wire == 2) return text(&t->datatype, s, a, b);
  if (number == 3 && wire == 0) return add_dim(t, value);
  if (number == 3 && wire == 2) {
    size_t pos = a;
    while (pos < b) {
      uint64_t dim;
      if (!varint(s, &pos, b, &dim) || add_dim(t, dim) < 0) return -1;
    }
  }
  return 0;
}

static int visit_infer(const uint8_t *s, void *into, uint64_t number, int wire, uint64_t value, size_t a, size_t b) {
  (void)value;
  infer *r = into;
  if (number == 1 && wire == 2) return text(&r->model, s, a, b);
  if (number == 2 && wire == 2) return text(&r->version, s, a, b);
  if (number == 5 && wire == 2) {
    if (r->ninputs >= MAX_ITEMS) return -1;
    tensor *t = &r->inputs[r->ninputs++];
    memset(t, 0, sizeof(*t));
    t->name.s = t->datatype.s = s;
    return each_field(s, a, b, false, visit_tensor, t, NULL) == READ_DONE ? 0 : -1;
  }
  return 0;
}

/* ---- the line: the JSON text common/traffic.py reads ---- */

typedef struct {
  char *data;
  size_t length, capacity;
} text_buffer;

static bool put(text_buffer *t, const char *bytes, size_t n) {
  if (t->length > SIZE_MAX / 4 || n > SIZE_MAX / 4 - t->length) return false; /* the doubling below stays within size_t */
  if (t->length + n > t->capacity) {
    size_t capacity = (t->length + n) * 2;
    char *grown = realloc(t->data, capacity);
    if (!grown) return false;
    t->data = grown, t->capacity = capacity;
  }
  memcpy(t->data + t->length, bytes, n);
  t->length += n;
  return true;
}

/* The length of the well-formed UTF-8 sequence at s[0..n) (RFC 3629: no overlong forms, no surrogates, nothing
 * past U+10FFFF), or 0 where none starts there. */
static size_t utf8_length(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  size_t length = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
  uint8_t low = 0x80, high = 0xbf; /* the bounds of the second byte */
  if (c < 0xc2 || c > 0xf4 || n < length) return 0;
  if (c == 0xe0) low = 0xa0;
  if (c == 0xed) high = 0x9f;
  if (c == 0xf0) low = 0x90;
  if (c == 0xf4) high = 0x8f;
  if (s[1] < low || s[1] > high) return 0;
  for (size_t i = 2; i < length; i++)
    if (s[i] < 0x80 || s[i] > 0xbf) return 0;
  return length;
}

static bool put_json_string(text_buffer *t, span value) {
  /* quotes, backslashes, control bytes (0-31, 127) and bytes of no well-formed UTF-8 sequence as \u00XX (each
   * such byte read as the character of its number, as Envoy's access log wrote them); the rest as it is */
  if (!put(t, "\"", 1)) return false;
  for (size_t i = value.a; i < value.b; i++) {
    uint8_t c = value.s[i];
    size_t sequence = c >= 0x80 ? utf8_length(value.s + i, value.b - i) : 1;
    if (c < 32 || c == 127 || c == '"' || c == '\\' || sequence == 0) {
      char escaped[8];
      snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      if (!put(t, escaped, 6)) return false;
    } else {
      if (!put(t, (const char *)value.s + i, sequence)) return false;
      i += sequence - 1;
    }
  }
  return put(t, "\"", 1);
}

/* A number's decimal digits, without printf's machinery (a few per request, on Envoy's worker thread). */
static size_t decimal(char *out, long long value) {
  char digits[24];
  size_t n = 0, length = 0;
  unsigned long long v = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
  do digits[n++] = (char)('0' + v % 10); while (v /= 10);
  if (value < 0) out[length++] = '-';
  while (n) out[length++] = digits[--n];
  return length;
}

static bool put_number(text_buffer *t, long long value) {
  char digits[24];
  return put(t, digits, decimal(digits, value));
}

static bool request_line(text_buffer *t, const infer *r, long long batch, bool replayed) {
  bool ok = put(t, "{\"model\":", 9) && put_json_string(t, r->model) && put(t, ",\"version\":", 11) &&
            put_json_string(t, r->version) && put(t, ",\"inputs\":[", 11);
  for (int i = 0; ok && i < r->ninputs; i++) {
    const tensor *in = &r->inputs[i];
    ok = (i == 0 || put(t, ",", 1)) && put(t, "[", 1) && put_json_string(t, in->name) && put(t, ",", 1) &&
         put_json_string(t, in->datatype) && put(t, ",[", 2);
    for (int d = 0; ok && d < in->ndims; d++) ok = (d == 0 || put(t, ",", 1)) && put_number(t, in->dims[d]);
    ok = ok && put(t, "]]", 2);
  }
  ok = ok && put(t, "],\"batch\":", 10) && put_number(t, batch);
  return ok && (!replayed || put(t, ",\"replayed\":true", 16)) && put(t, "}", 1);
}

/* ---- the module's own lines: a buffer the worker threads fill, a thread of its own that writes it out ---- */

#define LOG_FLUSH_BYTES (64 * 1024) /* the writer is woken past this */
#define LOG_MAX_BYTES (8 << 20)     /* past this unwritten, lines are dropped (and counted) */

struct line_writer {
  char *path;
  int fd;
  dev_t dev;
  ino_t ino;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  pthread_t thread;
  bool stop;
  text_buffer pending;        /* lines not yet written, filled under lock */
  unsigned long long dropped; /* lines refused past LOG_MAX_BYTES or lost to a failed write */
};

static int open_log(line_writer *w) {
  int fd = open(w->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0) w->dev = st.st_dev, w->ino = st.st_ino;
  return fd;
}

/* Writes out, off the lock, reopening the path where the keeper has renamed the file (rotation). */
static void write_out(line_writer *w, const char *data, size_t length) {
  struct stat st;
  if (w->fd < 0 || stat(w->path, &st) != 0 || st.st_ino != w->ino || st.st_dev != w->dev) {
    if (w->fd >= 0) close(w->fd);
    w->fd = open_log(w);
  }
  size_t done = 0;
  while (w->fd >= 0 && done < length) {
    ssize_t n = write(w->fd, data + done, length - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t)n;
  }
  if (done < length) {
    unsigned long long lost = 0;
    for (size_t i = done; i < length; i++) lost += data[i] == '\n';
    pthread_mutex_lock(&w->lock);
    w->dropped += lost;
    pthread_mutex_unlock(&w->lock);
  }
}

/* Takes what is pending under the lock and writes it without: the workers never wait on the disk. */
static void flush_pending(line_writer *w) {
  pthread_mutex_lock(&w->lock);
  text_buffer out = w->pending;
  w->pending = (text_buffer){0};
  pthread_mutex_unlock(&w->lock);
  if (out.length) write_out(w, out.data, out.length);
  free(out.data);
}

static void *writer_loop(void *arg) {
  line_writer *w = arg;
  for (;;) {
    pthread_mutex_lock(&w->lock);
    if (!w->stop && w->pending.length < LOG_FLUSH_BYTES) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_sec += 1;
      pthread_cond_timedwait(&w->wake, &w->lock, &until);
    }
    bool stop = w->stop;
    pthread_mutex_unlock(&w->lock);
    flush_pending(w);
    if (stop) return NULL;
  }
}

static line_writer *writer_start(const char *path) {
  line_writer *w = calloc(1, sizeof(line_writer));
  if (!w || !(w->path = strdup(path))) return free(w), NULL;
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->wake, NULL);
  w->fd = open_log(w);
  if (w->fd < 0 || pthread_create(&w->thread, NULL, writer_loop, w) != 0) {
    if (w->fd >= 0) close(w->fd);
    free(w->path), free(w);
    return NULL; /* the configuration is refused: Envoy says so at start */
  }
  return w;
}

static void writer_stop(line_writer *w) {
  if (!w) return;
  pthread_mutex_lock(&w->lock);
  w->stop = true;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL); /* it writes what is pending before it ends */
  if (w->fd >= 0) close(w->fd);
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->wake);
  free(w->pending.data), free(w->path), free(w);
}

static void writer_add(line_writer *w, const char *line, size_t length) {
  pthread_mutex_lock(&w->lock);
  if (w->pending.length + length > LOG_MAX_BYTES || !put(&w->pending, line, length)) {
    w->dropped++;
  } else if (w->pending.length >= LOG_FLUSH_BYTES) {
    pthread_cond_signal(&w->wake);
  }
  pthread_mutex_unlock(&w->lock);
}

static long long now_us(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- one stream ---- */

typedef struct {
  const config *config;
  bool done;      /* recorded, not ModelInfer, or unreadable: nothing more to do */
  bool want_known;
  uint64_t want;  /* the gRPC frame's message length */
  size_t limit;   /* bytes to copy before trying again: 5 + HEAD_FIRST, then 5 + head_bytes */
  size_t have;
  size_t capacity;
  uint8_t *bytes; /* the frame's first bytes: inline below, or grown up to 5 + head_bytes */
  long long arrival_us, began_us; /* wall clock and monotonic clock at the request's headers */
  uint64_t received;              /* body bytes received */
  text_buffer request;            /* the request's JSON text, for the module's own line */
  bool logged;
  bool replayed; /* sent by a replay (REPLAY_HEADER): its line says so */
  bool keep;     /* values: the body is being kept (false once past 5 + value_bytes) */
  size_t kept_length, kept_capacity;
  uint8_t *kept;
  uint8_t first[5 + HEAD_FIRST];
} stream;

static size_t min_size(size_t a, uint64_t b) { return b < a ? (size_t)b : a; }

/* READ_MORE: the inputs run past the bytes copied; READ_DONE: recorded or nothing to record */
static int record_message(void *filter, stream *st, const uint8_t *message, size_t length, bool cut) {
  infer r; /* 36 KB: only what is read before an input is added is cleared (visit_infer clears each input) */
  r.model = r.version = (span){message, 0, 0};
  r.ninputs = 0;
  uint64_t stopped_at = 0;
  if (each_field(message, 0, length, cut, visit_infer, &r, &stopped_at) != READ_DONE) return READ_ERROR;
  if (stopped_at && stopped_at < 6) return READ_MORE;
  if (r.model.b == r.model.a) return READ_DONE;
  long max_batch = max_batch_of(st->config, (const char *)message + r.model.a, r.model.b - r.model.a);
  long long batch = 1;
  if (max_batch > 0 && r.ninputs > 0 && r.inputs[0].ndims > 0) batch = r.inputs[0].dims[0];
  text_buffer line = {0};
  if (!request_line(&line, &r, batch, st->replayed)) {
    free(line.data);
  } else if (st->config->log) {
    st->request = line; /* written when the stream completes, with its status and duration */
  } else {
    dm_buffer ns = {"traffic", 7}, key = {"request", 7}, value = {line.data, line.length};
    envoy_dynamic_module_callback_http_set_dynamic_metadata_string(filter, ns, key, value);
    free(line.data);
  }
  return READ_DONE;
}

/* The gRPC status: the response's trailers, else its headers (a trailers-only answer); -1: none (reset). */
static long grpc_status(void *filter) {
  dm_buffer value = {0}, key = {"grpc-status", 11};
  if (!envoy_dynamic_module_callback_http_get_header(filter, TRAILER_RESPONSE, key, &value, 0, NULL) &&
      !envoy_dynamic_module_callback_http_get_header(filter, HEADER_RESPONSE, key, &value, 0, NULL))
    return -1;
  long status = 0;
  if (!value.ptr || value.length == 0 || value.length > 9) return -1;
  for (size_t i = 0; i < value.length; i++) {
    if (value.ptr[i] < '0' || value.ptr[i] > '9') return -1;
    status = status * 10 + (value.ptr[i] - '0');
  }
  return status;
}

static void drop_kept(stream *st) {
  free(st->kept);
  st->kept = NULL, st->kept_length = st->kept_capacity = 0, st->keep = false;
}

/* values: a copy of the body as it passes, up to 5 + value_bytes (the gRPC frame's prefix and its message). */
static void keep_bytes(stream *st, const uint8_t *data, size_t length) {
  size_t cap = 5 + st->config->value_bytes; /* value_bytes <= MAX_VALUE_BYTES: no overflow */
  if (length > cap - st->kept_length) { drop_kept(st); return; } /* kept_length <= cap throughout */
  size_t needed = st->kept_length + length;
  if (needed > st->kept_capacity) {
    size_t capacity = st->kept_capacity ? st->kept_capacity : 4096;
    while (capacity < needed) capacity = capacity > cap / 2 ? cap : capacity * 2;
    uint8_t *grown = realloc(st->kept, capacity);
    if (!grown) { drop_kept(st); return; }
    st->kept = grown, st->kept_capacity = capacity;
  }
  memcpy(st->kept + st->kept_length, data, length);
  st->kept_length = needed;
}

/* The kept body as the line's values, where it is one whole uncompressed message (as Envoy received it). */
static bool put_values(text_buffer *line, const stream *st) {
  const uint8_t *k = st->kept;
  if (!st->keep || st->kept_length < 5 || k[0] != 0) return true;
  uint64_t want = (uint64_t)k[1] << 24 | (uint64_t)k[2] << 16 | (uint64_t)k[3] << 8 | k[4];
  if (want != st->kept_length - 5) return true; /* cut short, or more than one message */
  if (!put(line, ",\"values\":{\"body\":\"", 19)) return false;
  char block[BASE64_LENGTH(BASE64_BLOCK)];
  for (size_t i = 5; i < st->kept_length; i += BASE64_BLOCK) {
    size_t n = st->kept_length - i < BASE64_BLOCK ? st->kept_length - i : BASE64_BLOCK;
    if (!put(line, block, module_base64(k + i, n, block))) return false;
  }
  return put(line, "\",\"header_length\":0}", 20);
}

/* The request's line: its JSON text, less the closing brace, then its values (where kept), arrival, protocol,
 * bytes, status, duration. */
static void write_line(void *filter, stream *st, bool complete) {
  if (st->logged || !st->request.data || !st->config->log) return;
  st->logged = true;
  long status = complete ? grpc_status(filter) : -1;
  text_buffer *line = &st->request;
  line->length--; /* the request's closing brace */
  bool ok = put_values(line, st) && put(line, ",\"t\":", 5) && put_number(line, st->arrival_us) &&
            put(line, ",\"protocol\":\"grpc\",\"bytes\":", 27) && put_number(line, (long long)st->received) &&
            put(line, ",\"status\":", 10) && (status < 0 ? put(line, "null", 4) : put_number(line, status)) &&
            put(line, ",\"duration_us\":", 15) && put_number(line, now_us(CLOCK_MONOTONIC) - st->began_us) &&
            put(line, "}\n", 2);
  if (ok) writer_add(st->config->log, line->data, line->length);
}

static bool reserve(stream *st, size_t needed) {
  if (needed <= st->capacity) return true;
  uint8_t *grown = malloc(needed);
  if (!grown) return false;
  memcpy(grown, st->bytes, st->have);
  if (st->bytes != st->first) free(st->bytes);
  st->bytes = grown, st->capacity = needed;
  return true;
}

static void feed(void *filter, stream *st, const uint8_t *data, size_t length) {
  size_t used = 0;
  const size_t full = 5 + st->config->head_bytes;
  for (;;) {
    size_t take = min_size(length - used, st->limit - st->have);
    if (take) {
      if (!reserve(st, st->limit)) { st->done = true; return; }
      memcpy(st->bytes + st->have, data + used, take);
      used += take, st->have += take;
    }
    if (!st->want_known && st->have >= 5) {
      if (st->bytes[0] != 0) { st->done = true; return; } /* compressed: not read */
      st->want = (uint64_t)st->bytes[1] << 24 | (uint64_t)st->bytes[2] << 16 | (uint64_t)st->bytes[3] << 8 |
                 st->bytes[4];
      st->want_known = true;
    }
    if (!st->want_known || st->have < min_size(st->limit, 5 + st->want)) return; /* the next chunk */
    size_t head = min_size(st->have - 5, st->want);
    int read = record_message(filter, st, st->bytes + 5, head, head < st->want);
    if (read != READ_MORE || st->limit >= full) { st->done = true; return; }
    st->limit = full;
  }
}

/* ---- event hooks ---- */

const char *envoy_dynamic_module_on_program_init(void) { return ABI_VERSION; }

void *envoy_dynamic_module_on_http_filter_config_new(void *envoy_config, dm_buffer name, dm_buffer text) {
  (void)envoy_config;
  if (name.length != 11 || memcmp(name.ptr, "record_grpc", 11) != 0) return NULL;
  return parse_config(text.ptr, text.length);
}

void envoy_dynamic_module_on_http_filter_config_destroy(void *c) { free_config(c); }

void *envoy_dynamic_module_on_http_filter_new(void *c, void *filter) {
  (void)filter;
  stream *st = malloc(sizeof(stream));
  if (!st) return NULL;
  st->config = c;
  st->done = st->want_known = false;
  st->want = 0;
  st->have = 0;
  st->limit = 5 + min_size(HEAD_FIRST, st->config->head_bytes);
  st->bytes = st->first;
  st->capacity = sizeof(st->first);
  st->arrival_us = st->began_us = 0;
  st->received = 0;
  st->request = (text_buffer){0};
  st->logged = st->replayed = false;
  st->keep = false;
  st->kept_length = st->kept_capacity = 0;
  st->kept = NULL;
  return st;
}

int envoy_dynamic_module_on_http_filter_request_headers(void *filter, void *module, bool end_of_stream) {
  stream *st = module;
  dm_buffer path = {0}, key = {":path", 5};
  bool found = envoy_dynamic_module_callback_http_get_header(filter, HEADER_REQUEST, key, &path, 0, NULL);
  size_t n = sizeof(GRPC_INFER) - 1;
  if (end_of_stream || !found || path.length != n || memcmp(path.ptr, GRPC_INFER, n) != 0) st->done = true;
  if (!st->done && st->config->log) st->arrival_us = now_us(CLOCK_REALTIME), st->began_us = now_us(CLOCK_MONOTONIC);
  if (!st->done) {
    dm_buffer mark = {0}, replay = {REPLAY_HEADER, sizeof(REPLAY_HEADER) - 1};
    st->replayed = envoy_dynamic_module_callback_http_get_header(filter, HEADER_REQUEST, replay, &mark, 0, NULL);
    st->keep = st->config->values;
  }
  return CONTINUE; /* streams and other calls pass untouched */
}

int envoy_dynamic_module_on_http_filter_request_body(void *filter, void *module, bool end_of_stream) {
  (void)end_of_stream;
  stream *st = module;
  if (st->done && !st->request.data) return drop_kept(st), CONTINUE; /* nothing to read, count or keep */
  size_t count = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, BODY_RECEIVED_REQUEST);
  if (count == 0) return CONTINUE;
  dm_buffer few[16];
  dm_buffer *chunks = count <= 16 ? few : malloc(count * sizeof(dm_buffer));
  if (!chunks) return st->done = true, CONTINUE;
  if (envoy_dynamic_module_callback_http_get_body_chunks(filter, BODY_RECEIVED_REQUEST, chunks))
    for (size_t i = 0; i < count; i++) {
      st->received += chunks[i].length;
      if (st->keep) keep_bytes(st, (const uint8_t *)chunks[i].ptr, chunks[i].length);
      if (!st->done) feed(filter, st, (const uint8_t *)chunks[i].ptr, chunks[i].length);
    }
  if (chunks != few) free(chunks);
  if (end_of_stream) st->done = true;
  return CONTINUE;
}

void envoy_dynamic_module_on_http_filter_destroy(void *module) {
  stream *st = module;
  if (!st) return;
  write_line(NULL, st, false); /* a stream that never completed: no status */
  if (st->bytes != st->first) free(st->bytes);
  free(st->request.data);
  free(st->kept);
  free(st);
}

/* The hooks Envoy resolves for every HTTP filter module; none of them is needed here. */
int envoy_dynamic_module_on_http_filter_request_trailers(void *f, void *m) { (void)f, (void)m; return CONTINUE; }
int envoy_dynamic_module_on_http_filter_response_headers(void *f, void *m, bool e) {
  (void)f, (void)m, (void)e;
  return CONTINUE;
}
int envoy_dynamic_module_on_http_filter_response_body(void *f, void *m, bool e) {
  (void)f, (void)m, (void)e;
  return CONTINUE;
}
int envoy_dynamic_module_on_http_filter_response_trailers(void *f, void *m) { (void)f, (void)m; return CONTINUE; }
int envoy_dynamic_module_on_http_filter_local_reply(void *f, void *m, uint32_t code, dm_buffer details, bool reset) {
  (void)f, (void)m, (void)code, (void)details, (void)reset;
  return CONTINUE;
}
void envoy_dynamic_module_on_http_filter_stream_complete(void *filter, void *module) {
  if (module) write_line(filter, module, true);
}
