/* The HTTP request checks (server/triton/front/http_checks.c), under AddressSanitizer and UBSan, each input they pass
 * handed to a reader of every byte (as Envoy's module records it).
 *
 *   fuzz_checks SECONDS SEED          well-formed requests for a model, then mutated (bytes flipped, cut, spliced,
 *                                     repeated), random paths and methods, each body copied into a buffer of exactly
 *                                     its length: a read past it, an overflow or a leak fails the run; a verdict must be
 *                                     a pass with a reading or a 4xx with a reason ("N cases, 0 failures").
 *   fuzz_checks serve RULES_FILE      one verdict per request read from stdin, for the tests that hold the C checks to
 *                                     Envoy's module of them: a request is a line "METHOD_LEN PATH_LEN CE_COUNT CE_LEN HL_COUNT
 *                                     HL_LEN BODY_LEN" then those bytes; the answer a line "STATUS\tREADING\tWHY". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../tpserve/server/triton/front/http_checks.h"

/* What the checks hand a recording of each input (the Envoy module's traffic line): every byte read, so that ASan
 * sees a pointer that is not good for its whole length. */
static void read_seen(void *arg, const struct check_input_seen *input) {
  unsigned long *sum = arg;
  for (size_t i = 0; i < input->name_len; i++) *sum += (unsigned char)input->name[i];
  for (size_t i = 0; i < input->datatype_len; i++) *sum += (unsigned char)input->datatype[i];
  for (int i = 0; i < input->rank; i++) *sum += (unsigned long)input->dims[i];
}

static unsigned long long state = 88172645463325252ull;
static unsigned long long next(void) {
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static const char RULES[] =
    "{\"models\": {\"m\": {\"max_batch_size\": 8, \"inputs\": {\"x\": {\"datatype\": \"FP32\", \"dims\": [2, -1]},"
    " \"s\": {\"datatype\": \"BYTES\", \"dims\": [1]}}}, \"n\": {\"max_batch_size\": 0, \"inputs\": {\"y\": "
    "{\"datatype\": \"INT64\", \"dims\": [3]}}}}, \"max_tensor_bytes\": 268435456, \"max_depth\": 32, \"max_keys\": 64,"
    " \"max_items\": 64, \"refused_override_keys\": [\"backend\", \"parameters\"]}";

static const char *const BODIES[] = {
    "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1,2,3],\"data\":[1,2,3,4,5,6]}]}",
    "{\"id\":\"a\",\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2,2,1],\"data\":[[1],[2],[3],[4]]},"
    "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[1,1],\"data\":[\"h\\u00e9\\ud83d\\ude00\"]}],"
    "\"outputs\":[{\"name\":\"o\",\"parameters\":{\"binary_data\":true}}],\"parameters\":{\"x-edge-call\":\"ab\"}}",
    "{\"inputs\":[{\"name\":\"y\",\"datatype\":\"INT64\",\"shape\":[3],\"parameters\":{\"binary_data_size\":24}}]}",
    "{\"inputs\":[{\"name\":\"y\",\"datatype\":\"INT64\",\"shape\":[3],\"parameters\":{\"shared_memory_region\":\"r\","
    "\"shared_memory_byte_size\":24}}]}",
    "{\"inputs\":[{\"name\":\"q\",\"datatype\":\"FP16\",\"shape\":[0,7],\"data\":[NaN,Infinity,-Infinity,1e300]}]}",
    "{\"parameters\":{\"config\":\"{\\\"backend\\\":\\\"python\\\",\\\"default_model_filename\\\":\\\"../x\\\"}\","
    "\"file:1/model.py\":\"aGk=\"}}",
    "{\"key\":\"/triton_python_backend_shm\",\"offset\":0,\"byte_size\":64}",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "{\"a\":1,\"a\":2}",
};

static const char *const PATHS[] = {
    "/v2/models/m/infer", "/v2/models/n/versions/1/infer", "/v2/models/zz/infer", "/v2/repository/models/m/load",
    "/v2/systemsharedmemory/region/r/register", "/v2/logging", "/v2", "/v2/models/../infer", "/v2/models/m/generate",
    "/v2/models/m?x=1", "/v2/models/%2e/infer", "/", "", "/v2/models//infer", "/v2/health/ready", "/v2/models/m",
};

static int failures = 0;

static void check_one(const struct check_rules *rules, const char *method, const char *path, size_t path_len,
                      const char *body, size_t body_len, const char *header_length) {
  char *exact = malloc(body_len ? body_len : 1); /* exactly the body: a read past it is caught */
  char *exact_path = malloc(path_len ? path_len : 1);
  memcpy(exact, body, body_len);
  memcpy(exact_path, path, path_len);
  unsigned long seen_sum = 0;
  struct check_request r = {.method = method, .method_len = strlen(method), .path = exact_path, .path_len = path_len,
                            .body = exact, .body_len = body_len, .seen = read_seen, .seen_arg = &seen_sum};
  if (header_length) r.header_length = header_length, r.header_length_len = strlen(header_length), r.header_length_count = 1;
  struct check_verdict v;
  check_http_request(rules, &r, &v);
  int known = v.status == 0 || v.status == 400 || v.status == 403 || v.status == 404 || v.status == 405 || v.status == 415;
  if (!known || (v.status != 0) != (v.why[0] != '\0') || (v.status && v.reading[0])) {
    failures++;
    fprintf(stderr, "status %d why '%s' reading '%s' for %s %.*s\n", v.status, v.why, v.reading, method, (int)path_len, path);
  }
  free(exact);
  free(exact_path);
}

static size_t mutate(char *buf, size_t len, size_t room) {
  size_t at = below(len + 1);
  switch (below(6)) {
  case 0: if (len) buf[below(len)] = (char)next(); break;
  case 1: if (len) return below(len); break; /* cut */
  case 2: if (len < room) { memmove(buf + at + 1, buf + at, len - at); buf[at] = "[]{}\",:\\0-eE."[below(14)]; return len + 1; } break;
  case 3: if (len > at) { memmove(buf + at, buf + at + 1, len - at - 1); return len - 1; } break;
  case 4: { /* repeat a piece */
    size_t from = below(len), n = below(len - from + 1);
    char *piece = malloc(n ? n : 1);
    memcpy(piece, buf + from, n);
    if (len + n <= room) memmove(buf + at + n, buf + at, len - at), memcpy(buf + at, piece, n), len += n;
    free(piece);
    return len;
  }
  default: if (len) buf[below(len)] = "0123456789\"\\u[]{}"[below(18)]; break;
  }
  return len;
}

static int fuzz(double seconds, unsigned long long seed) {
  char why[200];
  struct check_rules *rules = check_rules_load(RULES, strlen(RULES), why, sizeof why);
  if (rules == NULL) return fprintf(stderr, "%s\n", why), 1;
  state ^= seed * 0x9E3779B97F4A7C15ull;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  long cases = 0;
  static char buf[1 << 14];
  static const char *const methods[] = {"POST", "GET", "PUT", "POS"};
  static const char *const lengths[] = {NULL, NULL, "0", "12", "99", "012", "+1", "999999999", "1000000000"};
  do {
    for (int i = 0; i < 200; i++, cases++) {
      const char *body = BODIES[below(sizeof BODIES / sizeof BODIES[0])];
      size_t len = strlen(body);
      memcpy(buf, body, len);
      for (size_t m = below(4); m > 0; m--) len = mutate(buf, len, sizeof buf);
      if (below(50) == 0) { len = below(300); for (size_t k = 0; k < len; k++) buf[k] = (char)next(); }
      const char *path = PATHS[below(sizeof PATHS / sizeof PATHS[0])];
      char path_buf[128];
      size_t path_len = strlen(path);
      memcpy(path_buf, path, path_len);
      if (below(4) == 0) path_len = mutate(path_buf, path_len, sizeof path_buf);
      check_one(rules, below(8) ? "POST" : methods[below(4)], path_buf, path_len, buf, len, lengths[below(9)]);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  check_rules_free(rules);
  printf("%ld cases, %d failures\n", cases, failures);
  return failures != 0;
}

static char *read_exactly(size_t n) {
  char *out = malloc(n ? n : 1);
  if (n && fread(out, 1, n, stdin) != n) exit(3);
  return out;
}

static void put_clean(const char *text) {
  for (; *text; text++) putchar(*text == '\n' || *text == '\t' || *text == '\r' ? ' ' : *text);
}

static int serve(const char *rules_file) {
  FILE *f = fopen(rules_file, "rb");
  if (f == NULL) return perror(rules_file), 2;
  static char text[1 << 22];
  size_t n = fread(text, 1, sizeof text, f);
  fclose(f);
  char why[300];
  struct check_rules *rules = check_rules_load(text, n, why, sizeof why);
  if (rules == NULL) return fprintf(stderr, "%s\n", why), 2;
  size_t method_len, path_len, ce_len, hl_len, body_len;
  int ce_count, hl_count;
  while (scanf("%zu %zu %d %zu %d %zu %zu", &method_len, &path_len, &ce_count, &ce_len, &hl_count, &hl_len, &body_len) == 7) {
    if (getchar() != '\n') return 3;
    char *method = read_exactly(method_len), *path = read_exactly(path_len), *ce = read_exactly(ce_len);
    char *hl = read_exactly(hl_len), *body = read_exactly(body_len);
    unsigned long seen_sum = 0;
    struct check_request r = {method, method_len, path, path_len, ce_count ? ce : NULL, ce_len, ce_count,
                              hl_count ? hl : NULL, hl_len, hl_count, body, body_len, read_seen, &seen_sum};
    struct check_verdict v;
    check_http_request(rules, &r, &v);
    printf("%d\t", v.status);
    put_clean(v.reading);
    putchar('\t');
    put_clean(v.why);
    putchar('\n');
    fflush(stdout);
    free(method), free(path), free(ce), free(hl), free(body);
  }
  check_rules_free(rules);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "serve") == 0) return serve(argv[2]);
  if (argc == 3) return fuzz(atof(argv[1]), strtoull(argv[2], NULL, 10));
  fprintf(stderr, "usage: fuzz_checks SECONDS SEED | fuzz_checks serve RULES_FILE\n");
  return 2;
}
