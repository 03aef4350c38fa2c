/* The specs Python hands over to the native paths, in one place: triton_models/inprocess/native_path.py mirrors
 * ipn_spec and ipr_spec field by field with ctypes (native_tokenize.py mirrors bert_tokenize.h's ipt_spec), and
 * tests/unit/test_native_layout.py compiles this header to check that every size and offset agrees. */
#ifndef TPSERVE_NATIVE_SPECS_H
#define TPSERVE_NATIVE_SPECS_H

#include <stdint.h>

#include "ragged_plan.h"

enum { IPN_MAX_DIMS = 8, IPN_MAX_OUTPUTS = 8, IPN_MAX_BUCKETS = 32 };
enum { IPR_MAX_INPUTS = 4, IPR_MAX_OUTPUTS = 8, IPR_MAX_DIMS = 8, IPR_MAX_CELLS = 1024 };

/* The image path's spec (image_path.c). */
typedef struct {
  int32_t device;
  uint64_t stream;
  char input_name[128];
  int32_t input_dtype;
  uint32_t input_dims; /* inner dims: the shape without the batch axis */
  int64_t input_shape[IPN_MAX_DIMS];
  uint64_t input_row_bytes;
  uint32_t buckets;
  int64_t bucket_rows[IPN_MAX_BUCKETS];
  uint64_t graphs[IPN_MAX_BUCKETS];      /* cudaGraphExec_t of each bucket */
  uint64_t static_inputs[IPN_MAX_BUCKETS]; /* device addresses */
  uint64_t static_outputs[IPN_MAX_BUCKETS][IPN_MAX_OUTPUTS];
  uint32_t outputs;
  char output_names[IPN_MAX_OUTPUTS][128];
  int32_t output_dtypes[IPN_MAX_OUTPUTS];
  uint32_t output_dims[IPN_MAX_OUTPUTS];
  int64_t output_shapes[IPN_MAX_OUTPUTS][IPN_MAX_DIMS];
  uint64_t output_row_bytes[IPN_MAX_OUTPUTS];
} ipn_spec;

/* The sequence path's spec (ragged_path.c). */
typedef struct {
  int32_t device;
  uint64_t stream;
  ipr_grid grid;
  uint32_t inputs;
  char input_names[IPR_MAX_INPUTS][128];
  int32_t input_dtypes[IPR_MAX_INPUTS];
  uint32_t input_bytes[IPR_MAX_INPUTS]; /* bytes per element */
  int32_t mask;                         /* the input whose non-zero entries mark real tokens; -1: none */
  int32_t bounded[IPR_MAX_INPUTS];      /* 1: the input's values must lie in [low, high) (its value_range) */
  int64_t low[IPR_MAX_INPUTS], high[IPR_MAX_INPUTS];
  int32_t cell_of[IPR_MAX_LENGTHS][IPR_MAX_BATCHES]; /* the cell of (length bucket, batch bucket); -1: none */
  uint32_t cells;
  uint64_t graphs[IPR_MAX_CELLS]; /* cudaGraphExec_t of each cell */
  uint64_t static_inputs[IPR_MAX_CELLS][IPR_MAX_INPUTS];
  uint64_t static_outputs[IPR_MAX_CELLS][IPR_MAX_OUTPUTS];
  uint32_t outputs;
  char output_names[IPR_MAX_OUTPUTS][128];
  int32_t output_dtypes[IPR_MAX_OUTPUTS];
  int32_t per_token[IPR_MAX_OUTPUTS]; /* 1: [rows, length, ...]; 0: one row per row */
  uint32_t output_dims[IPR_MAX_OUTPUTS]; /* dims after the rows (and the length, per token) */
  int64_t output_shapes[IPR_MAX_OUTPUTS][IPR_MAX_DIMS];
  uint64_t output_unit_bytes[IPR_MAX_OUTPUTS]; /* bytes per row, or per token for a per-token output */
} ipr_spec;

#endif
