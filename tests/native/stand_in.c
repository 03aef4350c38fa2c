/* The stand-in of stand_in.h: Triton's backend API over si_request, and a CUDA driver over host memory. */
#include "stand_in.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

struct TRITONSERVER_Error {
  int code;
  char* message;
};

typedef struct {
  si_request* request;
  void* buffers[16];
  int outputs;
} si_response;

si_request** si_batch;
uint32_t si_batch_count;
int64_t si_low, si_high;
uint64_t si_out_of_range;
int si_check_staged;
static uint64_t staged_base[4096], staged_size[4096];
static int staged_count;

void si_watch_staged(uint64_t base, uint64_t size) {
  if (staged_count < 4096) staged_base[staged_count] = base, staged_size[staged_count++] = size;
}

void si_free_request(si_request* r) {
  for (uint32_t i = 0; i < r->count; ++i) {
    for (uint32_t b = 0; b < r->inputs[i].buffers; ++b) free(r->inputs[i].data[b]);
  }
  free(r);
}

TRITONSERVER_Error* TRITONSERVER_ErrorNew(int code, const char* msg) {
  TRITONSERVER_Error* e = calloc(1, sizeof *e);
  e->code = code;
  e->message = strdup(msg ? msg : "");
  return e;
}

void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error) {
  if (error == NULL) return;
  free(error->message);
  free(error);
}

static si_request* owner_of(const TRITONBACKEND_Input* input, uint32_t* at) {
  for (uint32_t k = 0; k < si_batch_count; ++k) {
    si_request* r = si_batch[k];
    if (r == NULL) continue;
    if ((const void*)input >= (const void*)r->inputs && (const void*)input < (const void*)(r->inputs + SI_MAX_INPUTS)) {
      *at = k;
      return r;
    }
  }
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_RequestInput(void* request, const char* name, TRITONBACKEND_Input** input) {
  si_request* r = request;
  for (uint32_t i = 0; i < r->count; ++i) {
    if (strcmp(r->inputs[i].name, name) == 0) {
      *input = (TRITONBACKEND_Input*)&r->inputs[i];
      return NULL;
    }
  }
  return TRITONSERVER_ErrorNew(3, "no such input");
}

TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name, int* datatype,
                                                  const int64_t** shape, uint32_t* dims, uint64_t* byte_size,
                                                  uint32_t* buffer_count) {
  si_input* in = (si_input*)input;
  if (name) *name = in->name;
  if (datatype) *datatype = in->dtype;
  if (shape) *shape = in->shape;
  if (dims) *dims = in->dims;
  if (byte_size) *byte_size = in->size;
  if (buffer_count) *buffer_count = in->buffers;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, uint32_t index, const void** buffer,
                                              uint64_t* byte_size, int* memory_type, int64_t* memory_type_id) {
  si_input* in = (si_input*)input;
  if (index >= in->buffers) return TRITONSERVER_ErrorNew(3, "no such buffer");
  uint32_t at = 0;
  if (owner_of(input, &at) != NULL) { /* a later request is read: the writers of earlier ones strike now */
    for (uint32_t k = 0; k < at; ++k) {
      si_request* earlier = si_batch[k];
      if (earlier && earlier->writer && !earlier->written) earlier->writer(earlier), earlier->written = 1;
    }
  }
  *buffer = in->data[index];
  *byte_size = in->bytes[index];
  *memory_type = 0;
  *memory_type_id = 0;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(void* request, uint32_t* count) {
  (void)request;
  *count = 0;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(void* request, uint32_t index, const char** name) {
  (void)request, (void)index;
  *name = "";
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseNew(void** response, void* request) {
  si_response* r = calloc(1, sizeof *r);
  r->request = request;
  *response = r;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(void* response, void** output, const char* name, int datatype,
                                                 const int64_t* shape, uint32_t dims) {
  (void)name, (void)datatype;
  for (uint32_t d = 0; d < dims; ++d) {
    if (shape[d] < 0) return TRITONSERVER_ErrorNew(3, "a negative output dim");
  }
  *output = response;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(void* output, void** buffer, uint64_t byte_size, int* memory_type,
                                               int64_t* memory_type_id) {
  si_response* r = output;
  if (r->outputs >= 16 || byte_size > (1ull << 30)) return TRITONSERVER_ErrorNew(1, "too large");
  *buffer = r->buffers[r->outputs++] = malloc(byte_size ? byte_size : 1);
  *memory_type = 0;
  *memory_type_id = 0;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseSend(void* response, uint32_t flags, TRITONSERVER_Error* error) {
  (void)flags;
  si_response* r = response;
  r->request->answered++;
  if (error) r->request->refused++;
  for (int k = 0; k < r->outputs; ++k) free(r->buffers[k]);
  free(r);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_RequestRelease(void* request, uint32_t flags) {
  (void)flags;
  ((si_request*)request)->released++;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(void* instance, void* request, _Bool ok,
                                                                uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  (void)instance, (void)request, (void)ok, (void)a, (void)b, (void)c, (void)d;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(void* instance, uint64_t n, uint64_t a,
                                                                     uint64_t b, uint64_t c, uint64_t d) {
  (void)instance, (void)n, (void)a, (void)b, (void)c, (void)d;
  return NULL;
}

/* metrics.c's part, without Triton's metrics API */
void ipn_report(void* instance, void* request, int ok, uint64_t exec_start, uint64_t compute_start,
                uint64_t compute_end, uint64_t exec_end, uint64_t answered) {
  (void)answered;
  ipn_ok(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, ok != 0, exec_start, compute_start,
                                                     compute_end, exec_end));
}

/* --- the driver: device memory is host memory */

static int device_get(int* device, int ordinal) { return *device = ordinal, 0; }
static int retain(void** context, int device) { return (void)device, *context = (void*)1, 0; }
static int set_current(void* context) { return (void)context, 0; }
static int nothing(void* a) { return (void)a, 0; }
static int two_nothing(void* a, void* b) { return (void)a, (void)b, 0; }
static int event_create(void** event, unsigned flags) { return (void)flags, *event = (void*)1, 0; }

static int to_device(uint64_t target, const void* source, size_t bytes, void* stream) {
  (void)stream;
  memcpy((void*)(uintptr_t)target, source, bytes);
  for (int k = 0; k < staged_count && si_check_staged; ++k) {
    if (target < staged_base[k] || target >= staged_base[k] + staged_size[k]) continue;
    const int64_t* ids = (const int64_t*)(uintptr_t)target;
    for (size_t e = 0; e < bytes / 8; ++e) {
      if (ids[e] < si_low || ids[e] >= si_high) si_out_of_range++;
    }
  }
  return 0;
}

static int to_host(void* target, uint64_t source, size_t bytes, void* stream) {
  (void)stream;
  memcpy(target, (const void*)(uintptr_t)source, bytes);
  return 0;
}

static int device_to_device(uint64_t target, uint64_t source, size_t bytes, void* stream) {
  (void)stream;
  memmove((void*)(uintptr_t)target, (const void*)(uintptr_t)source, bytes);
  return 0;
}

static int alloc_host(void** p, size_t bytes) { return (*p = malloc(bytes ? bytes : 1)) == NULL; }
static int free_host(void* p) { return free(p), 0; }

void si_install_driver(void) {
  cu.DeviceGet = device_get;
  cu.DevicePrimaryCtxRetain = retain;
  cu.CtxSetCurrent = set_current;
  cu.MemcpyHtoDAsync = to_device;
  cu.MemcpyDtoHAsync = to_host;
  cu.MemcpyDtoDAsync = device_to_device;
  cu.GraphLaunch = two_nothing;
  cu.EventCreate = event_create;
  cu.EventRecord = two_nothing;
  cu.EventSynchronize = nothing;
  cu.EventDestroy = nothing;
  cu.StreamSynchronize = nothing;
  cu.MemAllocHost = alloc_host;
  cu.MemFreeHost = free_host;
  cu.loaded = 1;
}
