/* The sequence path (ragged_path.c, included here for its spec's layout) under random and
 * adversarial requests: ids [rows, tokens] INT64 within value_range [0, 1000), a prefix mask. */
#include <stdio.h>

#include "../../tpserve/triton_models/inprocess/native/ragged_path.c"
#include "fuzz_common.h"

/* An id moved from inside value_range to 2^30 in the client's buffer, after the request was checked. */
static void beyond_vocabulary(si_request* r) {
  int64_t far = (int64_t)1 << 30;
  if (r->inputs[0].bytes[0] >= 8) memcpy(r->inputs[0].data[0], &far, 8);
}

static void open_path(void* instance) {
  static ipr_spec spec;
  memset(&spec, 0, sizeof spec);
  ipr_grid* g = &spec.grid;
  g->lengths = 2, g->length_buckets[0] = 8, g->length_buckets[1] = 16, g->rows_at[0] = 4, g->rows_at[1] = 4;
  g->batches = 3, g->batch_buckets[0] = 1, g->batch_buckets[1] = 2, g->batch_buckets[2] = 4;
  spec.inputs = 2, spec.mask = 1;
  snprintf(spec.input_names[0], 128, "input_ids");
  snprintf(spec.input_names[1], 128, "attention_mask");
  spec.input_dtypes[0] = spec.input_dtypes[1] = 9, spec.input_bytes[0] = spec.input_bytes[1] = 8;
  spec.bounded[0] = 1, spec.low[0] = 0, spec.high[0] = 1000;
  spec.cells = 6, spec.outputs = 1;
  snprintf(spec.output_names[0], 128, "embedding");
  spec.output_dtypes[0] = 11, spec.output_dims[0] = 1, spec.output_shapes[0][0] = 4, spec.output_unit_bytes[0] = 16;
  for (uint32_t k = 0; k < 2; ++k) {
    for (uint32_t j = 0; j < 3; ++j) {
      int c = (int)(k * 3 + j);
      spec.cell_of[k][j] = c;
      spec.graphs[c] = 1;
      uint64_t bytes = (uint64_t)g->batch_buckets[j] * (uint64_t)g->length_buckets[k] * 8;
      for (uint32_t i = 0; i < 2; ++i) spec.static_inputs[c][i] = (uint64_t)(uintptr_t)calloc(1, bytes);
      si_watch_staged(spec.static_inputs[c][0], bytes);
      spec.static_outputs[c][0] = (uint64_t)(uintptr_t)calloc(1, (uint64_t)g->batch_buckets[j] * 16);
    }
  }
  if (ipr_open(instance, &spec) != 0) fprintf(stderr, "ragged: ipr_open refused the spec\n"), fz_failures++;
}

static si_request* sequence_request(void) {
  si_request* r = calloc(1, sizeof *r);
  r->count = 2;
  int64_t rows = fz_below(6), width = fz_below(20);
  if (fz_below(12) == 0) rows = (int64_t)(fz_next() >> 2), width = 0; /* rows Triton would never batch */
  int64_t shape[2] = {rows, width};
  uint64_t elements = rows <= 6 ? (uint64_t)(rows * width) : 0, size = elements * 8;
  int64_t ids[256], mask[256];
  for (uint64_t e = 0; e < elements; ++e) {
    ids[e] = fz_below(40) == 0 ? 1000 + fz_below(5) : fz_below(1000); /* now and then one outside */
    mask[e] = (int64_t)(e % (uint64_t)width) < 1 + fz_below(width) ? 1 : 0;
  }
  uint64_t stated = fz_below(15) == 0 ? size + 8 : size;
  fz_input(&r->inputs[0], "input_ids", 9, shape, 2, (const char*)ids, size, stated);
  fz_input(&r->inputs[1], "attention_mask", 9, shape, 2, (const char*)mask, size, size);
  if (fz_below(3) == 0) r->writer = beyond_vocabulary;
  return r;
}

int fuzz_ragged(int rounds) {
  static int opened = 0, instance;
  if (!opened) open_path(&instance), opened = 1;
  si_low = 0, si_high = 1000;
  for (int round = 0; round < rounds; ++round) {
    si_request* requests[6];
    uint32_t count = (uint32_t)fz_below(5) + 2;
    for (uint32_t r = 0; r < count; ++r) requests[r] = sequence_request();
    si_batch = requests, si_batch_count = count;
    si_check_staged = 1;
    ipr_execute(&instance, (void**)requests, count);
    if (!fz_wait_released(requests, count)) fprintf(stderr, "ragged: a request never released\n"), fz_failures++;
    si_check_staged = 0;
    fz_expect_once("ragged", requests, count);
    if (si_out_of_range) {
      fprintf(stderr, "ragged: %llu ids outside value_range reached the device\n", (unsigned long long)si_out_of_range);
      fz_failures++, si_out_of_range = 0;
    }
    for (uint32_t r = 0; r < count; ++r) si_free_request(requests[r]);
  }
  return 0;
}
