/* Drives the native request paths of the in-process backend (images, sequences, the tokenize step, Python's batch
 * calls) with random and adversarial requests through stand_in.c, under AddressSanitizer and UBSan: any read past
 * a client's buffer, overflow or leak fails the run, as does a request answered or released other than once, or a
 * token id outside value_range reaching the device. A writer changes a request's bytes after its checks (shared
 * memory changed under the server): what runs must be what was checked.
 *
 *   fuzz_native SECONDS SEED [PARTS]   (PARTS: some of tokenize,batch,image,ragged; exit 0: every round held) */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "fuzz_common.h"

uint64_t fz_state = 88172645463325252ull;
int fz_failures = 0;

void fz_input(si_input* in, const char* name, int dtype, const int64_t* shape, uint32_t dims, const char* bytes,
              uint64_t size, uint64_t stated) {
  memset(in, 0, sizeof *in);
  snprintf(in->name, sizeof in->name, "%s", name);
  in->dtype = dtype, in->dims = dims, in->size = stated;
  for (uint32_t d = 0; d < dims && d < SI_MAX_DIMS; ++d) in->shape[d] = shape[d];
  uint64_t cut = size > 1 && fz_below(3) == 0 ? (uint64_t)fz_below((int64_t)size) : size;
  uint64_t parts[2] = {cut, size - cut};
  uint64_t at = 0;
  for (int b = 0; b < 2; ++b) {
    if (b == 1 && parts[1] == 0) break;
    in->data[b] = malloc(parts[b] ? parts[b] : 1);
    memcpy(in->data[b], bytes + at, parts[b]);
    in->bytes[b] = parts[b];
    in->buffers++;
    at += parts[b];
  }
}

int fz_wait_released(si_request** requests, uint32_t count) {
  for (int waited = 0; waited < 100000; ++waited) {
    int all = 1;
    for (uint32_t r = 0; r < count && all; ++r) all = requests[r]->released > 0;
    if (all) return 1;
    usleep(100);
  }
  return 0;
}

void fz_expect_once(const char* path, si_request** requests, uint32_t count) {
  for (uint32_t r = 0; r < count; ++r) {
    if (requests[r]->answered != 1 || requests[r]->released != 1) {
      fprintf(stderr, "%s: request %u answered %d times, released %d times\n", path, r, requests[r]->answered,
              requests[r]->released);
      fz_failures++;
    }
  }
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 5.0;
  fz_state ^= argc > 2 ? strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull : 0;
  if (fz_state == 0) fz_state = 1;
  const char* parts = argc > 3 ? argv[3] : "tokenize,batch,image,ragged";
  si_install_driver();
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  long rounds = 0;
  do {
    if (strstr(parts, "tokenize")) fuzz_tokenize(20);
    if (strstr(parts, "batch")) fuzz_batch_calls(20);
    if (strstr(parts, "image")) fuzz_image(10);
    if (strstr(parts, "ragged")) fuzz_ragged(10);
    rounds++;
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (fz_failures == 0 && (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  printf("fuzz_native: %ld rounds, %d failures\n", rounds, fz_failures);
  return fz_failures != 0;
}
