/* The tokenize step's native path (tokenize_path.c) and Python's batch calls (batch_calls.c)
 * under random and adversarial requests. */
#include <stdio.h>

#include "batch_calls.h"
#include "fuzz_common.h"
#include "tokenize_path.h"

static const char* WORDS[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "a", "b", "x"};
enum { WORD_COUNT = 10 };

static void open_tokenizer(void* instance) {
  static char words[256];
  static uint32_t offsets[WORD_COUNT], lengths[WORD_COUNT];
  static int64_t ids[WORD_COUNT];
  uint32_t at = 0;
  for (int w = 0; w < WORD_COUNT; ++w) {
    offsets[w] = at, lengths[w] = (uint32_t)strlen(WORDS[w]), ids[w] = w;
    memcpy(words + at, WORDS[w], lengths[w]);
    at += lengths[w];
  }
  ipt_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.words = words, spec.offsets = offsets, spec.lengths = lengths, spec.ids = ids, spec.count = WORD_COUNT;
  spec.prefix = "##", spec.unk_id = 1, spec.max_chars = 100, spec.lowercase = 1;
  spec.before[0] = 2, spec.befores = 1, spec.after[0] = 3, spec.afters = 1, spec.room = 14;
  spec.added = "[pad]\0[unk]\0[cls]\0[sep]\0";
  snprintf(spec.input_name, sizeof spec.input_name, "TEXT");
  snprintf(spec.output_names[0], IPT_NAME, "input_ids");
  snprintf(spec.output_names[1], IPT_NAME, "attention_mask");
  spec.output_dtypes[0] = 9, spec.output_dtypes[1] = 9;
  if (ipt_open(instance, &spec) != 0) fprintf(stderr, "tokenize: ipt_open failed\n"), fz_failures++;
}

/* The first text's length, in the client's buffer, made 1 MiB less one: a reader of the client's bytes after the
 * check would read far past them. */
static void lengthen(si_request* r) {
  uint32_t n = (1u << 20) - 1;
  if (r->inputs[0].bytes[0] >= 4) memcpy(r->inputs[0].data[0], &n, 4);
}

static si_request* text_request(void) {
  static const char pieces[] = "hello world as bx a b s x ";
  si_request* r = calloc(1, sizeof *r);
  r->count = 1;
  int64_t texts = fz_below(4) + (fz_below(8) == 0 ? 0 : 1);
  char bytes[4096];
  uint64_t size = 0;
  for (int64_t t = 0; t < texts; ++t) {
    uint32_t n = (uint32_t)fz_below(40);
    uint32_t stated = fz_below(10) == 0 ? (uint32_t)fz_next() : n; /* a length field that lies */
    memcpy(bytes + size, &stated, 4);
    for (uint32_t k = 0; k < n; ++k) bytes[size + 4 + k] = pieces[fz_below((int64_t)sizeof pieces - 1)];
    if (n && fz_below(20) == 0) bytes[size + 4 + fz_below(n)] = (char)fz_next(); /* a byte outside ASCII */
    size += 4 + n;
  }
  int64_t shape[2] = {texts, 1};
  if (fz_below(15) == 0) shape[0] = (int64_t)(fz_next() >> 1); /* a count of texts the bytes cannot hold */
  fz_input(&r->inputs[0], "TEXT", 13, shape, fz_below(2) ? 1 : 2, bytes, size, size);
  if (fz_below(4) == 0) r->writer = lengthen;
  return r;
}

int fuzz_tokenize(int rounds) {
  static int opened = 0;
  static int instance;
  if (!opened) open_tokenizer(&instance), opened = 1;
  for (int round = 0; round < rounds; ++round) {
    si_request* requests[8];
    uint32_t count = (uint32_t)fz_below(8) + 1;
    for (uint32_t r = 0; r < count; ++r) requests[r] = text_request();
    si_batch = requests, si_batch_count = count;
    int served = ipt_execute(&instance, (void**)requests, count);
    for (uint32_t r = 0; r < count && !served; ++r) { /* Python's path would serve them: nothing was answered */
      if (requests[r]->answered) fprintf(stderr, "tokenize: a batch left to Python was answered\n"), fz_failures++;
      requests[r]->answered = 1, requests[r]->released = 1;
    }
    fz_expect_once("tokenize", requests, count);
    for (uint32_t r = 0; r < count; ++r) si_free_request(requests[r]);
  }
  return 0;
}

int fuzz_batch_calls(int rounds) {
  static const int64_t element_bytes[15] = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 0, 2};
  for (int round = 0; round < rounds; ++round) {
    si_request* r = calloc(1, sizeof *r);
    r->count = 1;
    int64_t shape[2] = {fz_below(4), fz_below(8)};
    if (fz_below(3) == 0) shape[1] = (int64_t)((1ull << 61) + 1); /* 8 bytes of data: the product wraps to 8 */
    if (fz_below(5) == 0) shape[0] = -fz_below(3);
    char bytes[256] = {0};
    __int128 wanted = (__int128)shape[0] * shape[1] * 8;
    uint64_t size = wanted >= 0 && wanted <= 256 ? (uint64_t)wanted : 8;
    fz_input(&r->inputs[0], "ids", 9, shape, 2, bytes, size, size);
    si_request* batch[1] = {r};
    si_batch = batch, si_batch_count = 1;
    const char* names[1] = {"ids"};
    int32_t dtypes[1];
    int64_t shapes[2];
    uint8_t status[1];
    ipb_input_shapes((void**)batch, 1, names, 1, dtypes, shapes, status, element_bytes);
    int exact = shape[0] >= 0 && shape[1] >= 0 && wanted == (__int128)size;
    if (status[0] == 0 && !exact) {
      fprintf(stderr, "batch calls: shape [%lld, %lld] of %llu bytes read as whole\n", (long long)shape[0],
              (long long)shape[1], (unsigned long long)size);
      fz_failures++;
    }
    si_free_request(r);
  }
  return 0;
}
