/* What ragged_path.c gives the backend's shim and Python (ctypes): the sequence path: a batch of any lengths under
 * the grid's CUDA graphs. */
#ifndef TPSERVE_RAGGED_PATH_H
#define TPSERVE_RAGGED_PATH_H

#include <stdint.h>

#include "specs.h"

/* Registers the native path for instance; 0 on success, else a reason code (native_path.REASONS). */
int ipr_open(void* instance, const ipr_spec* spec);
/* Stops the instance's completion thread (after the batches in flight) and forgets it; counts as ipr_counts. */
void ipr_close(void* instance, uint64_t* counts);
/* What the instance served natively so far (copy_counts); untouched when it has no native path. */
void ipr_counts(void* instance, uint64_t* counts);
/* Serves the batch natively and returns 1, or returns 0 without touching it (no native path for this instance). */
int ipr_execute(void* instance, void** requests, uint32_t count);

#endif
