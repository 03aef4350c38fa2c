/* What image_path.c gives the backend's shim and Python (ctypes): the image path: fixed-shape models under CUDA
 * graphs. */
#ifndef TPSERVE_IMAGE_PATH_H
#define TPSERVE_IMAGE_PATH_H

#include <stdint.h>

#include "specs.h"

int ipn_open(void* instance, const ipn_spec* spec);
/* Stops the instance's completion thread (after the batches in flight) and forgets it; counts[0..1]: batches
 * served natively, their requests. */
void ipn_close(void* instance, uint64_t* counts);
/* How many batches and requests ran natively so far (counts as in ipn_close). */
void ipn_counts(void* instance, uint64_t* counts);
/* Serves the batch natively and returns 1, or returns 0 without touching it (no native path for this instance): the
 * caller hands it to Python. */
int ipn_execute(void* instance, void** requests, uint32_t count);

#endif
