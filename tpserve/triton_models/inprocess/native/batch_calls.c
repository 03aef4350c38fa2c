/* The in-process backend's batch calls: what Python would otherwise do request by request through ctypes (tens of microseconds
 * each), done here in one call per batch. Python reaches them through ctypes (this library, by path); they touch
 * no Python object, so the copies and the answers run with the GIL released (ipb_input_shapes keeps it: it takes
 * microseconds). */
#include <stdint.h>
#include <string.h>

#include "batch_calls.h"
#include "metrics.h"
#include "native.h"

enum { MAX_DIMS = 8 };
enum { READ_OK = 0, READ_BY_PYTHON = 1 };       /* status of a request's inputs */
enum { SENT = 0, SENT_ERROR = 1, DEFERRED = 2 }; /* status of a request's answer */

/* Every request's inputs: datatype and [rows, width] (shapes[2 * (r * n + i)]). A request whose inputs are not
 * two-dimensional host tensors of their stated size is READ_BY_PYTHON: Python reads it the slow way, which names
 * what is wrong (or copies device memory). */
void ipb_input_shapes(void** requests, uint32_t count, const char** names, uint32_t n, int32_t* dtypes,
                      int64_t* shapes, uint8_t* status, const int64_t* element_bytes) {
  for (uint32_t r = 0; r < count; ++r) {
    status[r] = READ_OK;
    for (uint32_t i = 0; i < n && status[r] == READ_OK; ++i) {
      TRITONBACKEND_Input* input = NULL;
      const char* name = NULL;
      const int64_t* shape = NULL;
      uint32_t dims = 0, buffers = 0;
      uint64_t size = 0;
      int dtype = 0;
      uint64_t elements = 0, bytes = 0;
      if (!ipn_ok(TRITONBACKEND_RequestInput(requests[r], names[i], &input)) ||
          !ipn_ok(TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &dims, &size, &buffers)) || dims != 2 ||
          dtype < 0 || dtype > 14 || element_bytes[dtype] <= 0 || !ipn_elements(shape, 2, &elements) ||
          shape[0] > IPN_MAX_ROWS || !ipn_mul(elements, (uint64_t)element_bytes[dtype], &bytes) || bytes != size ||
          size > IPN_MAX_REQUEST_BYTES) {
        status[r] = READ_BY_PYTHON;
        break;
      }
      uint64_t seen = 0;
      for (uint32_t b = 0; b < buffers; ++b) {
        const void* base = NULL;
        uint64_t bytes = 0;
        int memory = 0;
        int64_t device = 0;
        if (!ipn_ok(TRITONBACKEND_InputBuffer(input, b, &base, &bytes, &memory, &device)) || memory == MEMORY_GPU) {
          status[r] = READ_BY_PYTHON;
          break;
        }
        seen += bytes;
      }
      if (seen != size) status[r] = READ_BY_PYTHON;
      dtypes[r * n + i] = dtype;
      shapes[2 * (r * n + i)] = shape[0];
      shapes[2 * (r * n + i) + 1] = shape[1];
    }
  }
}

/* The bytes of one input, row after row, into rows of `stride` bytes (the caller zeroed the padding). */
static void copy_rows(TRITONBACKEND_Input* input, char* dest, int64_t row_bytes, int64_t stride) {
  const char* name = NULL;
  const int64_t* shape = NULL;
  uint32_t dims = 0, buffers = 0;
  uint64_t size = 0;
  int dtype = 0;
  if (row_bytes <= 0 || !ipn_ok(TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &dims, &size, &buffers))) return;
  int64_t filled = 0;
  for (uint32_t b = 0; b < buffers; ++b) {
    const void* base = NULL;
    uint64_t bytes = 0;
    int memory = 0;
    int64_t device = 0;
    if (!ipn_ok(TRITONBACKEND_InputBuffer(input, b, &base, &bytes, &memory, &device))) return;
    const char* from = base;
    if (row_bytes == stride && filled == 0 && bytes == size) { /* one buffer, rows as wide as the batch's */
      memcpy(dest, from, bytes);
      return;
    }
    while (bytes > 0) {
      int64_t row = filled / row_bytes, column = filled % row_bytes;
      uint64_t take = (uint64_t)(row_bytes - column) < bytes ? (uint64_t)(row_bytes - column) : bytes;
      memcpy(dest + row * stride + column, from, take);
      from += take;
      bytes -= take;
      filled += take;
    }
  }
}

/* Each READ_OK request's rows of every input into dest[i], from row first_row[r] on, rows of `widest`
 * elements (shapes as ipb_input_shapes gave them). */
void ipb_gather(void** requests, uint32_t count, const char** names, uint32_t n, const uint8_t* status,
                const int64_t* shapes, const int64_t* first_row, char** dest, int64_t widest,
                const int64_t* element_bytes_per_input) {
  for (uint32_t r = 0; r < count; ++r) {
    if (status[r] != READ_OK) continue;
    for (uint32_t i = 0; i < n; ++i) {
      TRITONBACKEND_Input* input = NULL;
      if (!ipn_ok(TRITONBACKEND_RequestInput(requests[r], names[i], &input))) continue;
      int64_t item = element_bytes_per_input[i], width = shapes[2 * (r * n + i) + 1];
      copy_rows(input, dest[i] + first_row[r] * widest * item, width * item, widest * item);
    }
  }
}

/* Answers every request from host rows: output k of request r is rows[r] rows of row_bytes[k] at
 * bases[k] + first_row[r] * row_bytes[k], shaped [rows[r], inner dims of output k], and sends the response
 * (sent_at[r]: when). The request stays the caller's: ipb_release reports its statistics and releases it, after
 * the answers (Triton's statistics cost more than the answer: summaries per request). A request whose output
 * Triton places in device memory is DEFERRED: its response is in responses[r], the buffers in
 * addresses[r * n + k] (0 where already written) and device ids in devices[...]; Python copies and sends it. A
 * Triton call that fails sends that request its error (SENT_ERROR). The time of each step is added to
 * spent[0..1] (ns): outputs made and written, sent. */
void ipb_answer(void** requests, uint32_t count, const int64_t* rows, const int64_t* first_row, uint32_t n,
                const char** names, const int32_t* dtypes, char** bases, const uint64_t* row_bytes,
                const int64_t* inner, const uint32_t* inner_dims, uint8_t* status, uint64_t* sent_at,
                void** responses, uint64_t* addresses, int64_t* devices, uint64_t* spent) {
  for (uint32_t r = 0; r < count; ++r) {
    uint64_t began = ipn_now();
    void* response = NULL;
    TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, requests[r]);
    int deferred = 0;
    for (uint32_t k = 0; k < n && err == NULL; ++k) {
      addresses[r * n + k] = 0;
      if (!ipn_wanted_output(requests[r], names[k], 0)) continue;
      int64_t shape[MAX_DIMS + 1];
      uint32_t dims = inner_dims[k] > MAX_DIMS ? MAX_DIMS : inner_dims[k];
      shape[0] = rows[r];
      for (uint32_t d = 0; d < dims; ++d) shape[d + 1] = inner[k * MAX_DIMS + d];
      void* output = NULL;
      void* buffer = NULL;
      uint64_t bytes = 0;
      int memory = 0;
      int64_t device = 0;
      if (rows[r] < 0 || !ipn_mul((uint64_t)rows[r], row_bytes[k], &bytes)) {
        err = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "an output's size does not fit in 64 bits");
        break;
      }
      err = TRITONBACKEND_ResponseOutput(response, &output, names[k], dtypes[k], shape, dims + 1);
      if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory, &device);
      if (err != NULL || bytes == 0) continue;
      if (memory == MEMORY_GPU) {
        addresses[r * n + k] = (uint64_t)(uintptr_t)buffer;
        devices[r * n + k] = device;
        deferred = 1;
      } else {
        memcpy(buffer, bases[k] + first_row[r] * row_bytes[k], bytes);
      }
    }
    responses[r] = response;
    if (err == NULL && deferred) {
      status[r] = DEFERRED;
      continue;
    }
    uint64_t written = ipn_now();
    if (response != NULL) ipn_ok(TRITONBACKEND_ResponseSend(response, COMPLETE_FINAL, err));
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
    status[r] = err == NULL ? SENT : SENT_ERROR;
    sent_at[r] = ipn_now();
    spent[0] += written - began;
    spent[1] += sent_at[r] - written;
  }
}

/* Reports each answered request's statistics (ok: status SENT; times: exec start, compute start, compute end;
 * the exec end is when it was sent) and releases it. Adds the ns to spent[2..3]: statistics, release. */
void ipb_release(void* instance, void** requests, uint32_t count, const uint8_t* status, const uint64_t* times,
                 const uint64_t* sent_at, uint64_t* spent) {
  for (uint32_t r = 0; r < count; ++r) {
    uint64_t began = ipn_now();
    ipn_report(instance, requests[r], status[r] == SENT, times[0], times[1], times[2], sent_at[r], 0);
    uint64_t reported = ipn_now();
    ipn_ok(TRITONBACKEND_RequestRelease(requests[r], RELEASE_ALL));
    spent[2] += reported - began;
    spent[3] += ipn_now() - reported;
  }
}
