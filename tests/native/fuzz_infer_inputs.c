/* The reading of a ModelInferRequest's first bytes (server/triton/front/grpc_infer_inputs.c) under AddressSanitizer
 * and UBSan: well-formed requests (a model, inputs of random names, datatypes and shapes, packed or not, raw contents
 * after them), mutated and cut at every length, and random bytes. Every read stays within its bytes; every input it
 * reports lies within them; a whole request's inputs are read as written, and a cut one's are a prefix of them.
 *
 *   fuzz_infer_inputs SECONDS SEED   (exit 0: every case held) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../tpserve/server/triton/front/grpc_infer_inputs.h"

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static size_t put_varint(uint8_t* at, uint64_t v) {
  size_t n = 0;
  do {
    at[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

static size_t put_bytes(uint8_t* at, uint32_t field, const uint8_t* bytes, size_t len) {
  size_t n = put_varint(at, (uint64_t)field << 3 | 2);
  n += put_varint(at + n, len);
  memcpy(at + n, bytes, len);
  return n + len;
}

struct written {
  int count;
  char names[INFER_MAX_INPUTS][12];
  int rank[INFER_MAX_INPUTS];
  int64_t shape[INFER_MAX_INPUTS][8];
};

/* A ModelInferRequest: model_name, then inputs, then raw contents; what it wrote. */
static size_t request(uint8_t* out, struct written* w) {
  size_t n = put_bytes(out, 1, (const uint8_t*)"digits_cnn", 10);
  w->count = (int)below(INFER_MAX_INPUTS + 1);
  for (int i = 0; i < w->count; i++) {
    uint8_t tensor[256];
    size_t t = 0;
    snprintf(w->names[i], sizeof w->names[i], "in%d", (int)below(1000));
    t += put_bytes(tensor + t, 1, (const uint8_t*)w->names[i], strlen(w->names[i]));
    t += put_bytes(tensor + t, 2, (const uint8_t*)"FP32", 4);
    w->rank[i] = (int)below(8) + 1;
    uint8_t packed[96];
    size_t p = 0;
    for (int d = 0; d < w->rank[i]; d++) p += put_varint(packed + p, (uint64_t)(w->shape[i][d] = (int64_t)below(1u << 20)));
    if (below(2)) {
      t += put_bytes(tensor + t, 3, packed, p);
    } else {
      for (int d = 0; d < w->rank[i]; d++) t += put_varint(tensor + t, 3 << 3), t += put_varint(tensor + t, (uint64_t)w->shape[i][d]);
    }
    n += put_bytes(out + n, 5, tensor, t);
  }
  uint8_t raw[64];
  for (size_t k = 0; k < sizeof raw; k++) raw[k] = (uint8_t)next();
  return n + put_bytes(out + n, 7, raw, below(sizeof raw));
}

static int within(const uint8_t* p, size_t len, const uint8_t* bytes, size_t n) {
  return p >= bytes && p + len <= bytes + n;
}

int main(int argc, char** argv) {
  if (argc != 3) return fprintf(stderr, "usage: fuzz_infer_inputs SECONDS SEED\n"), 2;
  double seconds = atof(argv[1]);
  state ^= strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  long cases = 0, failures = 0;
  static struct infer_lead found;
  do {
    uint8_t whole[8192];
    struct written w;
    size_t n = request(whole, &w);
    int mutated = below(3) == 0;
    for (int m = 0; mutated && m < 1 + (int)below(4); m++) whole[below(n)] ^= (uint8_t)(1u << below(8));
    if (below(10) == 0) {
      mutated = 1;
      for (size_t k = 0; k < n; k++) whole[k] = (uint8_t)next();
    }
    for (size_t cut = 0; cut <= n; cut += 1 + below(8)) {
      uint8_t* bytes = malloc(cut ? cut : 1); /* exactly cut bytes: a read past them is caught */
      memcpy(bytes, whole, cut);
      infer_lead_read(bytes, cut, &found);
      cases++;
      int bad = found.count < 0 || found.count > INFER_MAX_INPUTS || (found.model && !within(found.model, found.model_len, bytes, cut));
      for (int i = 0; i < found.count && !bad; i++) {
        const struct infer_input* x = &found.inputs[i];
        bad = !within(x->name, x->name_len, bytes, cut) || !within(x->datatype, x->datatype_len, bytes, cut) ||
              x->rank < 0 || x->rank > INFER_MAX_RANK;
        if (!bad && !mutated) { /* as written, in order */
          bad = x->name_len != strlen(w.names[i]) || memcmp(x->name, w.names[i], x->name_len) != 0 || x->rank != w.rank[i] ||
                memcmp(x->shape, w.shape[i], sizeof(int64_t) * (size_t)x->rank) != 0;
        }
      }
      if (!bad && !mutated && cut == n) bad = found.count != w.count; /* whole: every input */
      if (bad && failures++ < 5) fprintf(stderr, "fuzz_infer_inputs: a read of %zu bytes went wrong\n", cut);
      free(bytes);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  printf("%ld reads, %ld failures\n", cases, failures);
  return failures != 0;
}
