/* The plan of a ragged batch (triton_models/runtime/ragged.py's plan, exactly, in C): which rows run together at which
 * length. The native path for sequence models plans every batch with it; a unit test holds it to ragged.plan. */
#ifndef RAGGED_PLAN_H
#define RAGGED_PLAN_H

#include <stdint.h>

enum { IPR_MAX_LENGTHS = 64, IPR_MAX_BATCHES = 64 };

/* The grid (ragged.LengthGrid) as the plan reads it. */
typedef struct {
  uint32_t lengths;
  int64_t length_buckets[IPR_MAX_LENGTHS];
  int64_t rows_at[IPR_MAX_LENGTHS]; /* LengthGrid.rows_for of each length bucket */
  uint32_t batches;
  int64_t batch_buckets[IPR_MAX_BATCHES];
  int64_t min_run_tokens;
} ipr_grid;

/* The first of count ascending buckets that holds value (count: none does). */
int64_t ipr_bucket_at_least(const int64_t* buckets, uint32_t count, int64_t value);

/* Rows sorted by length (stable) and cut into groups. order: the rows in plan order; group_length, group_count:
 * each group's length and rows (its rows follow one another in order; at most n groups). Returns the groups, or
 * -1: out of memory or a row longer than the grid. */
int64_t ipr_plan(const ipr_grid* g, const int64_t* lengths, int64_t n, int64_t* order, int64_t* group_length,
                 int64_t* group_count);

#endif
