/* What the in-process backend's C files share: Triton's backend API as they call it (declared once, here), the
 * CUDA driver calls of the native per-batch paths (inprocess_native.c binds them) and those paths' small helpers.
 * The server compiles these files together into one library (server/triton/inprocess_build.py). */
#ifndef INPROCESS_NATIVE_H
#define INPROCESS_NATIVE_H

#include <stddef.h>
#include <stdint.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
extern TRITONSERVER_Error* TRITONSERVER_ErrorNew(int code, const char* msg);
extern void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
extern TRITONSERVER_Error* TRITONBACKEND_RequestInput(void* request, const char* name, TRITONBACKEND_Input** input);
extern TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name, int* datatype,
                                                         const int64_t** shape, uint32_t* dims, uint64_t* byte_size,
                                                         uint32_t* buffer_count);
extern TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, uint32_t index, const void** buffer,
                                                     uint64_t* byte_size, int* memory_type, int64_t* memory_type_id);
extern TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(void* request, uint32_t* count);
extern TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(void* request, uint32_t index, const char** name);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseNew(void** response, void* request);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(void* response, void** output, const char* name, int datatype,
                                                        const int64_t* shape, uint32_t dims);
extern TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(void* output, void** buffer, uint64_t byte_size, int* memory_type,
                                                      int64_t* memory_type_id);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseSend(void* response, uint32_t flags, TRITONSERVER_Error* error);
extern TRITONSERVER_Error* TRITONBACKEND_RequestRelease(void* request, uint32_t flags);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(void* instance, void* request, _Bool ok,
                                                                       uint64_t exec_start, uint64_t compute_start,
                                                                       uint64_t compute_end, uint64_t exec_end);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(void* instance, uint64_t batch_size,
                                                                            uint64_t exec_start, uint64_t compute_start,
                                                                            uint64_t compute_end, uint64_t exec_end);

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
int ipn_ok(TRITONSERVER_Error* err);
/* The request hears why (code, message) and is released with failed statistics. */
void ipn_refuse(void* instance, void* request, int code, const char* message, uint64_t started);
/* Triton's name of a datatype ("INT64"). */
const char* ipn_dtype_name(int dtype);
/* Whether the request asked for the output (a request that names none gets every one; outputs: the model's, 1
 * answers yes at once, 0 always asks). */
int ipn_wanted_output(void* request, const char* name, uint32_t outputs);
/* Reports a request's statistics to Triton and, when it succeeded, observes its time (exec_start to answered, or
 * to exec_end where answered is 0) in the instance's latency histogram (inprocess_metrics.c). */
void ipn_report(void* instance, void* request, int ok, uint64_t exec_start, uint64_t compute_start,
                uint64_t compute_end, uint64_t exec_end, uint64_t answered);
/* The histogram's family (backend start and end) and each instance's metric (instance start and end). */
void ipm_start(void);
void ipm_stop(void);
void ipm_instance_open(void* instance);
void ipm_instance_close(void* instance);
/* A pinned host buffer of at least `bytes` (grown by doubling; *room tracks its size); 0 when it failed. */
int ipn_pinned(char** buffer, uint64_t* room, uint64_t bytes);

#endif
