/* What the fuzzer's parts share: a random source, request building, and waiting for answers. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stand_in.h"

extern uint64_t fz_state;
extern int fz_failures;

static inline uint64_t fz_next(void) { /* xorshift64* */
  fz_state ^= fz_state >> 12, fz_state ^= fz_state << 25, fz_state ^= fz_state >> 27;
  return fz_state * 2685821657736338717ull;
}
static inline int64_t fz_below(int64_t n) { return n > 0 ? (int64_t)(fz_next() % (uint64_t)n) : 0; }

/* One input of a request: its bytes split over one or two buffers (the client's, malloc'd exactly). */
void fz_input(si_input* in, const char* name, int dtype, const int64_t* shape, uint32_t dims, const char* bytes,
              uint64_t size, uint64_t stated);
/* Waits (up to 10 s) until every request was released; 0: some never was. */
int fz_wait_released(si_request** requests, uint32_t count);
/* Each request answered and released exactly once; else counts a failure and says which. */
void fz_expect_once(const char* path, si_request** requests, uint32_t count);

int fuzz_image(int rounds);
int fuzz_ragged(int rounds);
int fuzz_tokenize(int rounds);
int fuzz_batch_calls(int rounds);

#endif
