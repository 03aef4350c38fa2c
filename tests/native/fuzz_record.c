/* The native gRPC recorder (server/edge/record_grpc.c) under AddressSanitizer and UBSan, through the stand-in for
 * Envoy's side of the ABI (tests/fixtures/record_grpc/harness.c, built beside it): gRPC bodies of ModelInfer
 * messages, well formed, truncated, with fields and lengths mutated at random and plain random bytes, cut into
 * random chunks, each stream recorded at most once; half the streams through a configuration that keeps the bodies
 * (values, 300 bytes: under and past it) and writes its own lines to a file in a folder of its own, every line of
 * which must end whole. A read past a chunk, an overflow or a leak fails the run.
 *
 *   fuzz_record SECONDS SEED   (exit 0: every stream held) */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../tpserve/server/edge/record_grpc.c"

/* tests/fixtures/record_grpc/harness.c, built beside this file */
void harness_set_path(const char *path, size_t length);
void harness_set_replay(const char *value);
void harness_set_status(const char *trailer, const char *header);
void harness_set_chunks(const dm_buffer *chunks, size_t count);
int harness_recorded_times(void);
void harness_reset(void);

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static size_t put_varint(uint8_t* out, uint64_t v) {
  size_t n = 0;
  do {
    out[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

static size_t put_field(uint8_t* out, uint64_t number, const void* bytes, size_t length) {
  size_t n = put_varint(out, number << 3 | 2);
  n += put_varint(out + n, length);
  memcpy(out + n, bytes, length);
  return n + length;
}

/* A ModelInfer message: model, version, inputs (name, datatype, shape), an output, raw contents. */
static size_t message(uint8_t* out) {
  static const char* names[] = {"digits_cnn", "other", "", "digits_cnn"};
  const char* model = names[below(4)];
  size_t n = put_field(out, 1, model, strlen(model));
  if (below(2)) n += put_field(out + n, 2, "1", 1);
  size_t inputs = below(4);
  for (size_t i = 0; i < inputs; ++i) {
    uint8_t tensor[512], dims[128];
    size_t t = put_field(tensor, 1, "input", 5), d = 0;
    t += put_field(tensor + t, 2, "FP32", 4);
    size_t rank = below(70);
    for (size_t k = 0; k < rank && d < sizeof dims - 10; ++k) d += put_varint(dims + d, below(3) ? below(9) : next());
    t += put_field(tensor + t, 3, dims, d);
    n += put_field(out + n, 5, tensor, t);
  }
  uint8_t raw[256];
  size_t raw_n = below(sizeof raw);
  for (size_t k = 0; k < raw_n; ++k) raw[k] = (uint8_t)next();
  n += put_field(out + n, 7, raw, raw_n);
  return n;
}

/* A gRPC body: one or two framed messages, then mutated or cut now and then, or random bytes. */
static size_t body(uint8_t* out, size_t room) {
  size_t n = 0;
  if (below(10) == 0) {
    n = below(room);
    for (size_t k = 0; k < n; ++k) out[k] = (uint8_t)next();
    return n;
  }
  for (size_t m = 1 + below(2); m-- > 0 && n + 9000 < room;) {
    size_t length = message(out + n + 5);
    out[n] = below(20) == 0 ? 1 : 0; /* now and then "compressed" */
    uint32_t stated = below(15) == 0 ? (uint32_t)next() : (uint32_t)length;
    out[n + 1] = (uint8_t)(stated >> 24), out[n + 2] = (uint8_t)(stated >> 16);
    out[n + 3] = (uint8_t)(stated >> 8), out[n + 4] = (uint8_t)stated;
    n += 5 + length;
  }
  for (size_t flips = below(3) == 0 ? 1 + below(4) : 0; flips-- > 0 && n;) out[below(n)] = (uint8_t)next();
  if (below(6) == 0 && n) n = below(n);
  return n;
}

static long recorded; /* streams whose request was recorded */

static int one_stream(void* config) {
  static uint8_t bytes[1 << 16];
  size_t n = body(bytes, sizeof bytes);
  static const char path[] = "/inference.GRPCInferenceService/ModelInfer";
  harness_set_path(path, below(10) ? sizeof path - 1 : 5);
  harness_set_replay(below(5) == 0 ? "1" : NULL);
  harness_set_status(below(2) ? "0" : NULL, below(3) ? NULL : "14");
  harness_reset();
  void* st = envoy_dynamic_module_on_http_filter_new(config, NULL);
  envoy_dynamic_module_on_http_filter_request_headers(NULL, st, n == 0);
  for (size_t at = 0; at < n;) {
    size_t pieces = 1 + below(3), room = n - at;
    dm_buffer chunks[3];
    size_t count = 0;
    for (; count < pieces && room; ++count) {
      size_t take = 1 + below(room);
      chunks[count].ptr = (const char*)bytes + at, chunks[count].length = take;
      at += take, room -= take;
    }
    harness_set_chunks(chunks, count);
    envoy_dynamic_module_on_http_filter_request_body(NULL, st, at == n);
  }
  if (below(2)) envoy_dynamic_module_on_http_filter_stream_complete(NULL, st);
  envoy_dynamic_module_on_http_filter_destroy(st);
  recorded += harness_recorded_times() == 1;
  if (harness_recorded_times() > 1) {
    fprintf(stderr, "fuzz_record: a stream recorded %d times\n", harness_recorded_times());
    return 0;
  }
  return 1;
}

/* Every line the module wrote is one JSON object ending its line (a torn or unterminated line fails). */
static int lines_end_whole(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  int c, previous = '\n', ok = 1;
  long lines = 0;
  while ((c = fgetc(f)) != EOF) {
    if (previous == '\n' && c != '{') ok = 0;
    if (c == '\n') ok = ok && previous == '}', ++lines;
    previous = c;
  }
  fclose(f);
  if (previous != '\n') ok = 0;
  if (!ok) fprintf(stderr, "fuzz_record: a line of %s is not whole\n", path);
  printf("fuzz_record: %ld lines written by the module\n", lines);
  return ok;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 5.0;
  state ^= argc > 2 ? strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull : 0;
  if (state == 0) state = 1;
  static const char text[] = "head_bytes 2048\n16 64696769";
  void* config = envoy_dynamic_module_on_http_filter_config_new(NULL, (dm_buffer){"record_grpc", 11},
                                                                (dm_buffer){text, sizeof text - 1});
  if (config == NULL) return 2;
  char folder[] = "/tmp/fuzz_record.XXXXXX", log[64], values[256]; /* the config: 113 bytes */
  if (!mkdtemp(folder)) return 2; /* 0700, ours */
  snprintf(log, sizeof log, "%s/lines.jsonl", folder);
  int at = snprintf(values, sizeof values, "head_bytes 2048\nvalues 300\nlog ");
  for (const char *c = log; *c && at < (int)sizeof values - 3; ++c) at += snprintf(values + at, 3, "%02x", *c);
  at += snprintf(values + at, sizeof values - (size_t)at, "\n16 64696769");
  void* keeping = envoy_dynamic_module_on_http_filter_config_new(NULL, (dm_buffer){"record_grpc", 11},
                                                                 (dm_buffer){values, (size_t)at});
  if (keeping == NULL) return 2;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  long streams = 0;
  int ok = 1;
  do {
    for (int k = 0; k < 200 && ok; ++k, ++streams) ok = one_stream(k % 2 ? keeping : config);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (ok && (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  envoy_dynamic_module_on_http_filter_config_destroy(config);
  envoy_dynamic_module_on_http_filter_config_destroy(keeping); /* its lines written out */
  ok = ok && lines_end_whole(log);
  unlink(log), rmdir(folder);
  printf("fuzz_record: %ld streams (%ld recorded), %d failures\n", streams, recorded, !ok);
  return !ok;
}
