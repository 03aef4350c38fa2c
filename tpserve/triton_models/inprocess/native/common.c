/* The helpers every native path of the in-process backend shares (native.h declares them): the CUDA driver's
 * calls bound through dlopen, Triton's clock, a refused request's answer, datatype names, the outputs a request
 * asked for, pinned host buffers. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "metrics.h"
#include "native.h"

ipn_driver cu;

int ipn_load_driver(void) {
  if (cu.loaded) return 1;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return 0;
#define BIND(field, symbol) \
  if ((*(void**)&cu.field = dlsym(lib, symbol)) == NULL) return 0;
  BIND(DeviceGet, "cuDeviceGet");
  BIND(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  BIND(CtxSetCurrent, "cuCtxSetCurrent");
  BIND(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  BIND(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  BIND(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  BIND(GraphLaunch, "cuGraphLaunch");
  BIND(EventCreate, "cuEventCreate");
  BIND(EventRecord, "cuEventRecord");
  BIND(EventSynchronize, "cuEventSynchronize");
  BIND(EventDestroy, "cuEventDestroy_v2");
  BIND(StreamSynchronize, "cuStreamSynchronize");
  BIND(MemAllocHost, "cuMemAllocHost_v2");
  BIND(MemFreeHost, "cuMemFreeHost");
#undef BIND
  cu.loaded = 1;
  return 1;
}

uint64_t ipn_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void ipn_refuse(void* instance, void* request, int code, const char* message, uint64_t started) {
  void* response = NULL;
  if (ipn_ok(TRITONBACKEND_ResponseNew(&response, request)) && response != NULL) {
    TRITONSERVER_Error* why = TRITONSERVER_ErrorNew(code, message);
    ipn_ok(TRITONBACKEND_ResponseSend(response, COMPLETE_FINAL, why));
    TRITONSERVER_ErrorDelete(why); /* the sender keeps its error: Triton copies what it sends */
  }
  uint64_t now = ipn_now();
  ipn_report(instance, request, 0, started, now, now, now, 0);
  ipn_ok(TRITONBACKEND_RequestRelease(request, RELEASE_ALL));
}

int ipn_pinned(char** buffer, uint64_t* room, uint64_t bytes) {
  if (*buffer != NULL && *room >= bytes) return 1;
  uint64_t size = *room ? *room : 4096;
  while (size < bytes) size *= 2;
  if (*buffer != NULL) cu.MemFreeHost(*buffer);
  *buffer = NULL, *room = 0;
  if (cu.MemAllocHost((void**)buffer, (size_t)size) != 0) {
    *buffer = NULL;
    return 0;
  }
  *room = size;
  return 1;
}

int ipn_wanted_output(void* request, const char* name, uint32_t outputs) {
  uint32_t asked = 0;
  if (outputs == 1 || !ipn_ok(TRITONBACKEND_RequestOutputCount(request, &asked)) || asked == 0) return 1;
  for (uint32_t k = 0; k < asked; ++k) {
    const char* other = NULL;
    if (ipn_ok(TRITONBACKEND_RequestOutputName(request, k, &other)) && other && strcmp(other, name) == 0) return 1;
  }
  return 0;
}

static const char* DTYPE_NAMES[] = {"INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                    "INT32",   "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"};

const char* ipn_dtype_name(int dtype) { return dtype >= 0 && dtype <= 14 ? DTYPE_NAMES[dtype] : "?"; }
