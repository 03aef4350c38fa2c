/* The deadline's renaming in header blocks (server/triton/front/grpc_headers.c) under AddressSanitizer and UBSan. Each
 * case is a block of random representations (indexed fields, size updates, literals with indexed or literal names,
 * plain or Huffman-coded, lengths as multi-byte integers) among which grpc-timeout names are placed, plain and
 * coded (with RFC 7541's padding, and longer); it is walked byte by byte and must come out as sent except at the
 * last byte of each such name, which must be renamed. Mutated and random blocks must be walked within their bytes,
 * changing no more bytes than the walk says it renamed, and checked whole (hpack_check) within their bytes, the table
 * kept within its bounds.
 *
 *   fuzz_headers SECONDS SEED   (exit 0: every case held) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../tpserve/server/triton/front/grpc_headers.h"

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 2685821657736338717ull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static const uint8_t PLAIN[12] = "grpc-timeout";
static const uint8_t CODED[9] = {0x9a, 0xca, 0xc8, 0xb2, 0x4d, 0x49, 0x4f, 0x6a, 0x7f};

#define ROOM 4096
static uint8_t block[ROOM], expected[ROOM], out[ROOM];
static size_t used;

static void put(uint8_t byte) {
  if (used < ROOM) block[used] = expected[used] = byte, used++;
}

/* An integer with an n-bit prefix (flags in the prefix byte's other bits). */
static void integer(uint32_t value, int bits, uint8_t flags) {
  uint32_t max = (1u << bits) - 1;
  if (value < max) {
    put((uint8_t)(flags | value));
    return;
  }
  put((uint8_t)(flags | max));
  value -= max;
  while (value >= 128) put((uint8_t)(0x80 | (value & 0x7f))), value >>= 7;
  put((uint8_t)value);
}

/* A string: the deadline's name (plain, coded, coded with longer padding) or random bytes. */
static void string(int deadline) {
  if (deadline == 1) {
    integer(12, 7, 0);
    for (int i = 0; i < 12; i++) put(PLAIN[i]);
    if (used <= ROOM) expected[used - 1] = 's';
  } else if (deadline >= 2) {
    size_t extra = deadline == 3 ? 1 + below(4) : 0;
    integer((uint32_t)(9 + extra), 7, 0x80);
    for (int i = 0; i < 9; i++) put(CODED[i]);
    for (size_t i = 0; i < extra; i++) put(0xff);
    if (used <= ROOM) expected[used - 1] = extra ? 0x7f : 0x3f;
  } else {
    size_t length = below(below(8) ? 20 : 300);
    integer((uint32_t)length, 7, below(2) ? 0x80 : 0);
    for (size_t i = 0; i < length; i++) put((uint8_t)next());
  }
}

static void representation(void) {
  switch (below(5)) {
  case 0: integer((uint32_t)(1 + below(300)), 7, 0x80); break; /* indexed */
  case 1: integer((uint32_t)below(5000), 5, 0x20); break;      /* size update */
  case 2: { /* a literal with an indexed name: incremental indexing (6-bit prefix), or without / never (4-bit) */
    int incremental = (int)below(2);
    integer((uint32_t)(1 + below(300)), incremental ? 6 : 4, incremental ? 0x40 : (below(2) ? 0x10 : 0x00));
    string(0);
    break;
  }
  default: { /* a literal name: sometimes the deadline's */
    put(below(2) ? 0x40 : (below(2) ? 0x00 : 0x10));
    string(below(3) ? 0 : 1 + (int)below(3));
    string(0);
  }
  }
}

static int walk(size_t length, uint32_t *renamed) {
  struct hpack_walk w = {0};
  hpack_walk_start(&w);
  for (size_t i = 0; i < length; i++) out[i] = hpack_walk_byte(&w, block[i]);
  *renamed = w.renamed;
  return 0;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  state ^= argc > 2 ? strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull : 1;
  unsigned long cases = 0, failures = 0, renames = 0;
  time_t end = time(NULL) + (time_t)seconds;
  while (time(NULL) < end) {
    for (int round = 0; round < 1000; round++, cases++) {
      used = 0;
      for (size_t n = 1 + below(12); n > 0 && used < ROOM - 400; n--) representation();
      uint32_t renamed = 0;
      walk(used, &renamed);
      renames += renamed;
      if (memcmp(out, expected, used) != 0) {
        if (failures++ < 5) printf("case %lu: a block came out other than renamed as expected\n", cases);
      }
      for (size_t flips = 1 + below(6); flips > 0 && used; flips--) block[below(used)] = (uint8_t)next();
      size_t length = below(3) ? used : below(ROOM);
      if (length > used) for (size_t i = used; i < length; i++) block[i] = (uint8_t)next();
      struct hpack_table table; /* the whole-block check reads any block within its bytes, and says yes or no */
      hpack_table_start(&table);
      uint8_t path = 0xff;
      int verdict = hpack_check(&table, block, used, &path) | hpack_check(&table, block, length, NULL);
      if (verdict != 0 && verdict != -1) {
        if (failures++ < 5) printf("case %lu: the block check answered %d\n", cases, verdict);
      }
      if (path != 0xff && (path & ~HPACK_OWN_CALL_ID) > HPACK_PATH_INFER) {
        if (failures++ < 5) printf("case %lu: the block's :path read as %u\n", cases, path);
      }
      if (table.count > HPACK_ENTRIES || table.size > table.max) {
        if (failures++ < 5) printf("case %lu: the table went past its bounds\n", cases);
      }
      walk(length, &renamed);
      size_t changed = 0;
      for (size_t i = 0; i < length; i++) changed += out[i] != block[i];
      if (changed > renamed) {
        if (failures++ < 5) printf("case %lu: %zu bytes changed, %u renamed\n", cases, changed, renamed);
      }
    }
  }
  printf("%lu blocks, %lu names renamed, %lu failures\n", cases, renames, failures);
  return failures != 0;
}
