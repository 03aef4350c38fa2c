/* The plan of a ragged batch: ragged.plan, exactly (ragged_plan.h). */
#include "ragged_plan.h"

#include <stdlib.h>

int64_t ipr_bucket_at_least(const int64_t* buckets, uint32_t count, int64_t value) {
  uint32_t lo = 0, hi = count;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (buckets[mid] < value) lo = mid + 1;
    else hi = mid;
  }
  return lo; /* == count: none holds it */
}

static int64_t run_cost(const ipr_grid* g, int64_t rows, uint32_t bucket) {
  int64_t length = g->length_buckets[bucket], cap = g->rows_at[bucket];
  int64_t full = rows / cap, rest = rows % cap;
  int64_t cost = full * (g->min_run_tokens + cap * length); /* each run: its launch, then its tokens */
  if (rest) {
    int64_t rows_bucket = g->batch_buckets[ipr_bucket_at_least(g->batch_buckets, g->batches, rest)];
    cost += g->min_run_tokens + rows_bucket * length;
  }
  return cost;
}

int64_t ipr_plan(const ipr_grid* g, const int64_t* lengths, int64_t n, int64_t* order, int64_t* group_length,
                 int64_t* group_count) {
  if (n == 0) return 0;
  int64_t longest = g->length_buckets[g->lengths - 1];
  int64_t* seen = calloc((size_t)longest + 2, sizeof *seen); /* a counting sort by length: stable */
  if (seen == NULL) return -1;
  for (int64_t r = 0; r < n; ++r) {
    if (lengths[r] < 0 || lengths[r] > longest) return free(seen), -1;
    seen[lengths[r] + 1]++;
  }
  for (int64_t v = 1; v <= longest + 1; ++v) seen[v] += seen[v - 1];
  for (int64_t r = 0; r < n; ++r) order[seen[lengths[r]]++] = r;
  free(seen);
  /* the length buckets present, with their rows */
  int64_t present[IPR_MAX_LENGTHS], counts[IPR_MAX_LENGTHS];
  uint32_t m = 0;
  for (int64_t p = 0; p < n; ++p) {
    int64_t bucket = ipr_bucket_at_least(g->length_buckets, g->lengths, lengths[order[p]]);
    if (m == 0 || present[m - 1] != bucket) present[m] = bucket, counts[m++] = 0;
    counts[m - 1]++;
  }
  /* the cheapest spans of neighbouring buckets (each its own span when runs have no floor) */
  int64_t best[IPR_MAX_LENGTHS + 1], cut[IPR_MAX_LENGTHS + 1], before[IPR_MAX_LENGTHS + 1];
  before[0] = 0, best[0] = 0, cut[0] = 0;
  for (uint32_t k = 0; k < m; ++k) before[k + 1] = before[k] + counts[k];
  for (uint32_t end = 1; end <= m; ++end) {
    best[end] = INT64_MAX, cut[end] = end - 1;
    if (g->min_run_tokens <= 0) continue;
    for (uint32_t start = 0; start < end; ++start) {
      int64_t cost = best[start] + run_cost(g, before[end] - before[start], (uint32_t)present[end - 1]);
      if (cost < best[end]) best[end] = cost, cut[end] = start;
    }
  }
  uint32_t spans_first[IPR_MAX_LENGTHS], spans_last[IPR_MAX_LENGTHS], spans = 0;
  for (uint32_t end = m; end > 0; end = (uint32_t)cut[end]) {
    spans_first[spans] = (uint32_t)cut[end], spans_last[spans++] = end - 1;
  }
  int64_t groups = 0;
  for (uint32_t k = spans; k-- > 0;) {
    int64_t first = before[spans_first[k]], last = before[spans_last[k] + 1];
    uint32_t bucket = (uint32_t)present[spans_last[k]];
    for (int64_t start = first; start < last; start += g->rows_at[bucket]) {
      int64_t rows = last - start < g->rows_at[bucket] ? last - start : g->rows_at[bucket];
      group_length[groups] = g->length_buckets[bucket];
      group_count[groups++] = rows;
    }
  }
  return groups;
}

