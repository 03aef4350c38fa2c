/* What the in-process backend's C files share: Triton's API (backend_api.h), the CUDA driver calls of the native
 * per-batch paths and those paths' small helpers (common.c). The server compiles these files together into one
 * library (server/triton/inprocess_build.py). */
#ifndef TPSERVE_NATIVE_H
#define TPSERVE_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#include "backend_api.h"

/* Bounds every native path holds a request to, whatever Triton checked before: rows of one batch, bytes of one
 * input. A request beyond them is refused (or left to Python), never multiplied into a size that wraps. */
enum { IPN_MAX_ROWS = 1 << 20 };
#define IPN_MAX_REQUEST_BYTES (1ull << 31)

/* a * b into *out; 0 (and *out untouched) when the product does not fit in 64 bits. */
static inline int ipn_mul(uint64_t a, uint64_t b, uint64_t* out) {
  uint64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return 0;
  *out = product;
  return 1;
}

/* The elements of a shape into *out; 0 when a dim is negative or the product does not fit in 64 bits. */
static inline int ipn_elements(const int64_t* shape, uint32_t dims, uint64_t* out) {
  uint64_t n = 1;
  for (uint32_t d = 0; d < dims; ++d) {
    if (shape[d] < 0 || !ipn_mul(n, (uint64_t)shape[d], &n)) return 0;
  }
  *out = n;
  return 1;
}

enum { MEMORY_GPU = 2, RELEASE_ALL = 1, COMPLETE_FINAL = 1, ERROR_INTERNAL = 1, ERROR_INVALID_ARG = 3 };

/* The driver calls the native paths use (CUresult is an int; handles are pointers), bound by ipn_load_driver. */
typedef struct {
  int (*DeviceGet)(int*, int);
  int (*DevicePrimaryCtxRetain)(void**, int);
  int (*CtxSetCurrent)(void*);
  int (*MemcpyHtoDAsync)(uint64_t, const void*, size_t, void*);
  int (*MemcpyDtoHAsync)(void*, uint64_t, size_t, void*);
  int (*MemcpyDtoDAsync)(uint64_t, uint64_t, size_t, void*);
  int (*GraphLaunch)(void*, void*);
  int (*EventCreate)(void**, unsigned);
  int (*EventRecord)(void*, void*);
  int (*EventSynchronize)(void*);
  int (*EventDestroy)(void*);
  int (*StreamSynchronize)(void*);
  int (*MemAllocHost)(void**, size_t);
  int (*MemFreeHost)(void*);
  int loaded;
} ipn_driver;

extern ipn_driver cu;

/* 1 once the driver's calls are bound (libcuda.so.1, through dlopen), else 0. */
int ipn_load_driver(void);
/* CLOCK_MONOTONIC in nanoseconds: Triton's statistics' clock. */
uint64_t ipn_now(void);
/* 1 for no error; an error is deleted and gives 0. */
static inline int ipn_ok(TRITONSERVER_Error* err) {
  if (err == NULL) return 1;
  TRITONSERVER_ErrorDelete(err);
  return 0;
}
/* The request hears why (code, message) and is released with failed statistics. */
void ipn_refuse(void* instance, void* request, int code, const char* message, uint64_t started);
/* Triton's name of a datatype ("INT64"). */
const char* ipn_dtype_name(int dtype);
/* Whether the request asked for the output (a request that names none gets every one; outputs: the model's, 1
 * answers yes at once, 0 always asks). */
int ipn_wanted_output(void* request, const char* name, uint32_t outputs);
/* A pinned host buffer of at least `bytes` (grown by doubling; *room tracks its size); 0 when it failed. */
int ipn_pinned(char** buffer, uint64_t* room, uint64_t bytes);

#endif
