/* The image path (image_path.c, included here for its spec's layout) under random and adversarial requests:
 * FP32 [rows, 3, 4, 4], buckets of 4 and 8 rows. */
#include <stdio.h>

#include "../../tpserve/triton_models/inprocess/native/image_path.c"
#include "fuzz_common.h"

static void open_path(void* instance) {
  static ipn_spec spec;
  memset(&spec, 0, sizeof spec);
  snprintf(spec.input_name, sizeof spec.input_name, "input");
  spec.input_dtype = 11, spec.input_dims = 3, spec.input_shape[0] = 3, spec.input_shape[1] = 4;
  spec.input_shape[2] = 4, spec.input_row_bytes = 192;
  spec.buckets = 2, spec.bucket_rows[0] = 4, spec.bucket_rows[1] = 8;
  spec.outputs = 1;
  snprintf(spec.output_names[0], sizeof spec.output_names[0], "logits");
  spec.output_dtypes[0] = 11, spec.output_dims[0] = 1, spec.output_shapes[0][0] = 10, spec.output_row_bytes[0] = 40;
  for (int k = 0; k < 2; ++k) {
    spec.graphs[k] = 1;
    spec.static_inputs[k] = (uint64_t)(uintptr_t)calloc(1, (uint64_t)spec.bucket_rows[k] * 192);
    spec.static_outputs[k][0] = (uint64_t)(uintptr_t)calloc(1, (uint64_t)spec.bucket_rows[k] * 40);
  }
  if (ipn_open(instance, &spec) != 0) fprintf(stderr, "image: ipn_open refused the spec\n"), fz_failures++;
}

static si_request* image_request(void) {
  si_request* r = calloc(1, sizeof *r);
  r->count = 1;
  int64_t shape[4] = {fz_below(5), 3, 4, 4};
  if (fz_below(10) == 0) shape[0] = (int64_t)(fz_next() >> 1); /* rows whose bytes wrap 64 bits */
  if (fz_below(10) == 0) shape[1 + fz_below(3)] = fz_below(6);
  uint64_t size = shape[0] <= 4 ? (uint64_t)shape[0] * 192 : (uint64_t)shape[0] * 192; /* wraps as a liar would */
  uint64_t real = size <= 4 * 192 ? size : 0;
  char bytes[4 * 192] = {0};
  fz_input(&r->inputs[0], "input", fz_below(15) ? 11 : 9, shape, 4, bytes, real, size);
  return r;
}

int fuzz_image(int rounds) {
  static int opened = 0, instance;
  if (!opened) open_path(&instance), opened = 1;
  for (int round = 0; round < rounds; ++round) {
    si_request* requests[4];
    uint32_t count = (uint32_t)fz_below(4) + 1;
    for (uint32_t r = 0; r < count; ++r) requests[r] = image_request();
    si_batch = requests, si_batch_count = count;
    ipn_execute(&instance, (void**)requests, count);
    if (!fz_wait_released(requests, count)) fprintf(stderr, "image: a request never released\n"), fz_failures++;
    fz_expect_once("image", requests, count);
    for (uint32_t r = 0; r < count; ++r) si_free_request(requests[r]);
  }
  return 0;
}
