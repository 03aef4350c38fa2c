/* The edge's admission check reads which model a call is for from client bytes (server/edge/admission_parse.h):
 * an HTTP path, or the first bytes of a gRPC ModelInfer message. Under AddressSanitizer and UBSan: well-formed
 * messages (model_name first, after other fields, cut anywhere), mutated ones, random bytes and random paths, each
 * copied into a buffer of exactly its length so that a read one byte past it fails the run. A name found must lie
 * within the bytes, be at most ADMISSION_NAME_MAX long, and be the name written where the message is whole.
 *
 *   fuzz_admission SECONDS SEED   (prints "N cases, 0 failures"; exit 0 when none failed) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../../tpserve/server/edge/admission_parse.h"

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static size_t put_varint(uint8_t *out, uint64_t v) {
  size_t n = 0;
  do {
    out[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

/* A ModelInfer message with model_name `name` (after a few other fields where asked), its gRPC prefix first. */
static size_t message(uint8_t *out, const char *name, size_t length, int before) {
  uint8_t body[1024];
  size_t n = 0;
  for (int i = 0; i < before; i++) { /* id (field 3, a string), then a varint field and a fixed one */
    n += put_varint(body + n, 3 << 3 | 2), n += put_varint(body + n, 4), memcpy(body + n, "abcd", 4), n += 4;
    n += put_varint(body + n, 9 << 3 | 0), n += put_varint(body + n, next() & 0xffffff);
    n += put_varint(body + n, 10 << 3 | 5), memset(body + n, 7, 4), n += 4;
  }
  n += put_varint(body + n, 1 << 3 | 2), n += put_varint(body + n, length);
  memcpy(body + n, name, length), n += length;
  n += put_varint(body + n, 2 << 3 | 2), n += put_varint(body + n, 1), body[n++] = '1';
  out[0] = 0, out[1] = (uint8_t)(n >> 24), out[2] = (uint8_t)(n >> 16), out[3] = (uint8_t)(n >> 8), out[4] = (uint8_t)n;
  memcpy(out + 5, body, n);
  return n + 5;
}

static int check_grpc(const uint8_t *given, size_t length, const char *want, size_t want_length, int whole) {
  uint8_t *copy = malloc(length ? length : 1); /* exactly the bytes: one past them is ASan's */
  memcpy(copy, given, length);
  const char *name = NULL;
  size_t found = 0;
  int failed = 0;
  if (admission_model_from_grpc(copy, length, &name, &found)) {
    if ((const uint8_t *)name < copy || (const uint8_t *)name + found > copy + length || found == 0 ||
        found > ADMISSION_NAME_MAX)
      failed = 1;
    if (want && whole && (found != want_length || memcmp(name, want, found) != 0)) failed = 1;
  } else if (want && whole && want_length <= ADMISSION_NAME_MAX && want_length > 0) {
    failed = 1; /* a whole, well-formed message's name is always found */
  }
  free(copy);
  return failed;
}

static int check_path(const char *given, size_t length) {
  char *copy = malloc(length ? length : 1);
  memcpy(copy, given, length);
  const char *name = NULL;
  size_t found = 0;
  int failed = 0;
  if (admission_model_from_path(copy, length, &name, &found))
    failed = name < copy + 11 || name + found > copy + length || found == 0 || found > ADMISSION_NAME_MAX ||
             memchr(name, '/', found) != NULL;
  free(copy);
  return failed;
}

static int known_paths(void) {
  const char *good[] = {"/v2/models/m/infer", "/v2/models/m/versions/2/infer", "/v2/models/m/infer?x=1"};
  const char *bad[] = {"/v2/models/m", "/v2/models//infer", "/v2/models/m/ready", "/v2/models/m/versions//infer",
                       "/v2/models/m/inferx", "/v2/health/ready", "/v2/models/m/versions/2/infer/x"};
  int failed = 0;
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    const char *name = NULL;
    size_t n = 0;
    failed += !admission_model_from_path(good[i], strlen(good[i]), &name, &n) || n != 1 || name[0] != 'm';
  }
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *name = NULL;
    size_t n = 0;
    failed += admission_model_from_path(bad[i], strlen(bad[i]), &name, &n);
  }
  return failed;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  state ^= argc > 2 ? strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull : 1;
  unsigned long cases = 0, failures = (unsigned long)known_paths();
  time_t end = time(NULL) + (time_t)seconds;
  uint8_t buffer[2048];
  char name[300];
  while (time(NULL) < end) {
    for (int round = 0; round < 1000; round++, cases++) {
      size_t length = 1 + below(sizeof name - 1);
      for (size_t i = 0; i < length; i++) name[i] = (char)('a' + below(26));
      size_t n = message(buffer, name, length, (int)below(4));
      size_t cut = below(8) ? n : below(n + 1); /* whole, or cut anywhere */
      failures += (unsigned long)check_grpc(buffer, cut, name, length, cut == n);
      for (size_t flips = below(6), i = 0; i < flips && n; i++) buffer[below(n)] = (uint8_t)next(); /* mutated */
      failures += (unsigned long)check_grpc(buffer, below(n + 1), NULL, 0, 0);
      size_t random_length = below(64);
      for (size_t i = 0; i < random_length; i++) buffer[i] = (uint8_t)next();
      failures += (unsigned long)check_grpc(buffer, random_length, NULL, 0, 0);
      static const char alphabet[] = "/v2modelsinfer?=versions0123456789";
      size_t path_length = below(48);
      char path[64];
      memcpy(path, "/v2/models/", 11);
      for (size_t i = 11; i < path_length; i++) path[i] = alphabet[below(sizeof alphabet - 1)];
      failures += (unsigned long)check_path(path, path_length < 11 ? path_length : path_length);
    }
  }
  printf("%lu cases, %lu failures\n", cases, failures);
  return failures ? 1 : 0;
}
