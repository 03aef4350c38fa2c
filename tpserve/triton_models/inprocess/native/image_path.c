/* The native per-batch path of the in-process backend: fixed-shape models under CUDA graphs (images).
 *
 * Python loads the model, compiles it and captures one CUDA graph per batch bucket when the instance starts
 * (torch_runtime.StagedRunner). It then hands this file the graphs' executable handles, their static buffers'
 * device addresses and the instance's stream (ipn_open), which adds two slots of pinned host memory of its own.
 * From there on Triton's
 * execute for that instance never enters the interpreter:
 *
 *   execute (Triton's thread): check every request's input (datatype, shape, bytes, host memory), copy its rows
 *     into a free slot's pinned staging, queue on the stream: one host-to-device copy into the bucket's static
 *     input, cuGraphLaunch, one device-to-host copy per output, an event; hand the batch to the completion thread
 *     and return (two batches in flight: the next one is read while this one computes);
 *   completion thread: wait for the event, write each request's rows into its response, send it, report its
 *     statistics, release it, report the batch, free the slot.
 *
 * A request whose input is wrong hears why and is released here; the batch goes on without it. Inputs in GPU
 * memory (the client's CUDA shared memory) are copied device to device, outputs Triton places there host to
 * device. Nothing here holds the GIL. The CUDA driver is reached through dlopen (libcuda.so.1; common.c binds it), as the server's own libraries do.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image_path.h"
#include "metrics.h"
#include "native.h"
#include "specs.h"

enum { IPN_SLOTS = 2, IPN_MAX_INSTANCES = 64 };


typedef struct {
  void** requests; /* the batch's requests that run (others were answered at execute) */
  TRITONBACKEND_Input** inputs; /* each one's input, as check_input found it */
  int64_t* rows;
  uint32_t count;
  int64_t total;
  uint64_t exec_start, compute_start;
  int launched; /* 0: nothing queued on the GPU (every request was refused) */
  int failed;   /* a driver call of the batch failed: its requests hear so */
} ipn_batch;

typedef struct {
  void* instance;
  ipn_spec spec;
  void* context;
  void* events[IPN_SLOTS];
  char* staging[IPN_SLOTS];                     /* pinned, ours: the largest bucket's input rows */
  char* host_outputs[IPN_SLOTS][IPN_MAX_OUTPUTS]; /* pinned, ours: its output rows */
  ipn_batch batches[IPN_SLOTS];
  int busy[IPN_SLOTS];
  int queue[IPN_SLOTS], head, queued; /* slots handed to the completion thread, in order */
  int stopping;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  pthread_t thread;
  uint64_t native_batches, native_requests;
} ipn_state;

static ipn_state* registry[IPN_MAX_INSTANCES];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static ipn_state* find(void* instance) {
  for (int i = 0; i < IPN_MAX_INSTANCES; ++i) {
    ipn_state* s = registry[i];
    if (s != NULL && s->instance == instance) return s;
  }
  return NULL;
}

static void describe_shape(char* out, size_t room, const int64_t* shape, uint32_t dims, int batch_axis) {
  size_t used = (size_t)snprintf(out, room, "[%s", batch_axis ? "-1" : "");
  for (uint32_t d = 0; d < dims && used < room; ++d) {
    used += (size_t)snprintf(out + used, room - used, "%s%lld", (d || batch_axis) ? ", " : "", (long long)shape[d]);
  }
  if (used < room) snprintf(out + used, room - used, "]");
}

/* 1: the request's input is what the model takes (rows set); 0: why not is in message. */
static int check_input(ipn_state* s, void* request, int64_t* rows, TRITONBACKEND_Input** found, char* message,
                       size_t room) {
  const ipn_spec* p = &s->spec;
  TRITONBACKEND_Input* input = NULL;
  const char* name = NULL;
  const int64_t* shape = NULL;
  uint32_t dims = 0, buffers = 0;
  uint64_t size = 0;
  int dtype = 0;
  if (!ipn_ok(TRITONBACKEND_RequestInput(request, p->input_name, &input)) ||
      !ipn_ok(TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &dims, &size, &buffers))) {
    snprintf(message, room, "input %s is missing", p->input_name);
    return 0;
  }
  int same = dtype == p->input_dtype && dims == p->input_dims + 1 && shape[0] >= 0 && shape[0] <= IPN_MAX_ROWS;
  for (uint32_t d = 0; same && d < p->input_dims; ++d) same = shape[d + 1] == p->input_shape[d];
  uint64_t expected = 0;
  if (!same || !ipn_mul((uint64_t)shape[0], p->input_row_bytes, &expected) || size != expected) {
    char got[160], wanted[160];
    describe_shape(got, sizeof got, shape, dims, 0);
    describe_shape(wanted, sizeof wanted, p->input_shape, p->input_dims, 1);
    snprintf(message, room, "input %s: %s %s, expected %s %s", p->input_name, ipn_dtype_name(dtype), got,
             ipn_dtype_name(p->input_dtype), wanted);
    return 0;
  }
  for (uint32_t b = 0; b < buffers; ++b) {
    const void* base = NULL;
    uint64_t bytes = 0;
    int memory = 0;
    int64_t device = 0;
    if (!ipn_ok(TRITONBACKEND_InputBuffer(input, b, &base, &bytes, &memory, &device))) {
      snprintf(message, room, "input %s: buffer %u unreadable", p->input_name, b);
      return 0;
    }
  }
  *rows = shape[0];
  *found = input;
  return 1;
}

/* Where a batch's rows go: host rows into the slot's staging (then one host-to-device copy per run of them), rows
 * in device memory straight into the bucket's static input; both at the same byte offset. */
typedef struct {
  char* staging;
  uint64_t target; /* the bucket's static input */
  uint64_t at, run; /* bytes placed so far; where the current run of host bytes began */
  uint64_t limit;   /* the batch's bytes: nothing is written past them */
  void* stream;
  int failed;
} ipn_cursor;

static void flush_host(ipn_cursor* c) {
  if (c->at > c->run && !c->failed) {
    c->failed = cu.MemcpyHtoDAsync(c->target + c->run, c->staging + c->run, c->at - c->run, c->stream) != 0;
  }
  c->run = c->at;
}

/* One request's input (checked: check_input) into the batch's rows at the cursor. */
static void gather(TRITONBACKEND_Input* input, ipn_cursor* c) {
  const char* name = NULL;
  const int64_t* shape = NULL;
  uint32_t dims = 0, buffers = 0;
  uint64_t size = 0;
  int dtype = 0;
  if (!ipn_ok(TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &dims, &size, &buffers))) {
    c->failed = 1;
    return;
  }
  for (uint32_t b = 0; b < buffers; ++b) {
    const void* base = NULL;
    uint64_t bytes = 0;
    int memory = 0;
    int64_t device = 0;
    if (!ipn_ok(TRITONBACKEND_InputBuffer(input, b, &base, &bytes, &memory, &device))) return;
    if (bytes > c->limit - c->at) { /* more bytes than the request's shape: never past the staging */
      c->failed = 1;
      return;
    }
    if (memory == MEMORY_GPU) {
      flush_host(c);
      if (!c->failed) c->failed = cu.MemcpyDtoDAsync(c->target + c->at, (uint64_t)(uintptr_t)base, bytes, c->stream);
      c->at += bytes;
      c->run = c->at;
    } else {
      memcpy(c->staging + c->at, base, bytes);
      c->at += bytes;
    }
  }
}

/* One request's rows of every output into its response, sent; 1 when it went out whole. */
static int answer(ipn_state* s, int slot, void* request, int64_t first, int64_t rows) {
  const ipn_spec* p = &s->spec;
  void* response = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, request);
  for (uint32_t k = 0; k < p->outputs && err == NULL; ++k) {
    if (!ipn_wanted_output(request, p->output_names[k], p->outputs)) continue;
    int64_t shape[IPN_MAX_DIMS + 1];
    shape[0] = rows;
    for (uint32_t d = 0; d < p->output_dims[k]; ++d) shape[d + 1] = p->output_shapes[k][d];
    void* output = NULL;
    void* buffer = NULL;
    uint64_t bytes = (uint64_t)rows * p->output_row_bytes[k];
    int memory = 0;
    int64_t device = 0;
    err = TRITONBACKEND_ResponseOutput(response, &output, p->output_names[k], p->output_dtypes[k], shape,
                                       p->output_dims[k] + 1);
    if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory, &device);
    if (err != NULL || bytes == 0) continue;
    const char* from = s->host_outputs[slot][k] + first * p->output_row_bytes[k];
    if (memory == MEMORY_GPU) { /* the client's CUDA shared memory: one copy to the device */
      int failed = cu.MemcpyHtoDAsync((uint64_t)(uintptr_t)buffer, from, bytes, (void*)(uintptr_t)p->stream) ||
                   cu.StreamSynchronize((void*)(uintptr_t)p->stream);
      if (failed) err = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "copying an output into device memory failed");
    } else {
      memcpy(buffer, from, bytes);
    }
  }
  if (response != NULL) ipn_ok(TRITONBACKEND_ResponseSend(response, COMPLETE_FINAL, err));
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
  return err == NULL && response != NULL;
}

static void finish(ipn_state* s, int slot) {
  ipn_batch* b = &s->batches[slot];
  int ran = !b->failed && (!b->launched || cu.EventSynchronize(s->events[slot]) == 0);
  uint64_t compute_end = ipn_now();
  int64_t first = 0;
  for (uint32_t r = 0; r < b->count; ++r) {
    int sent = ran ? answer(s, slot, b->requests[r], first, b->rows[r]) : 0;
    if (!ran) {
      ipn_refuse(s->instance, b->requests[r], ERROR_INTERNAL, "the batch failed on the device", b->exec_start);
      continue;
    }
    ipn_report(s->instance, b->requests[r], sent, b->exec_start, b->compute_start, compute_end, ipn_now(), 0);
    ipn_ok(TRITONBACKEND_RequestRelease(b->requests[r], RELEASE_ALL));
    first += b->rows[r];
  }
  if (b->count && ran) {
    ipn_ok(TRITONBACKEND_ModelInstanceReportBatchStatistics(s->instance, (uint64_t)b->total, b->exec_start,
                                                             b->compute_start, compute_end, ipn_now()));
  }
}

static void release_memory(ipn_state* s) {
  for (int i = 0; i < IPN_SLOTS; ++i) {
    if (s->events[i]) cu.EventDestroy(s->events[i]);
    if (s->staging[i]) cu.MemFreeHost(s->staging[i]);
    for (int k = 0; k < IPN_MAX_OUTPUTS; ++k) {
      if (s->host_outputs[i][k]) cu.MemFreeHost(s->host_outputs[i][k]);
    }
    free(s->batches[i].requests);
    free(s->batches[i].inputs);
    free(s->batches[i].rows);
  }
  free(s);
}

static void* complete(void* arg) {
  ipn_state* s = arg;
  cu.CtxSetCurrent(s->context);
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->queued && !s->stopping) pthread_cond_wait(&s->changed, &s->lock);
    if (!s->queued) break;
    int slot = s->queue[s->head];
    s->head = (s->head + 1) % IPN_SLOTS;
    s->queued--;
    pthread_mutex_unlock(&s->lock);
    finish(s, slot);
    pthread_mutex_lock(&s->lock);
    s->busy[slot] = 0;
    pthread_cond_broadcast(&s->changed);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Registers the native path for instance; 0 on success, else a reason code (1: no driver, 2: context,
 * 3: events, 4: no room, 5: thread, 6: a spec out of bounds). */
/* The whole spec Python handed over, checked before any of it is used: bounds, names, buckets ascending, each
 * row's bytes what its shape says, the largest bucket's buffers within 64 bits. */
static int spec_fits(const ipn_spec* p) {
  if (p->buckets == 0 || p->buckets > IPN_MAX_BUCKETS || p->outputs == 0 || p->outputs > IPN_MAX_OUTPUTS ||
      p->input_dims > IPN_MAX_DIMS || p->input_name[0] == 0 || memchr(p->input_name, 0, sizeof p->input_name) == NULL) {
    return 0;
  }
  for (uint32_t k = 0; k < p->buckets; ++k) {
    if (p->bucket_rows[k] < 1 || p->bucket_rows[k] > IPN_MAX_ROWS || (k && p->bucket_rows[k] <= p->bucket_rows[k - 1]))
      return 0;
  }
  uint64_t rows = (uint64_t)p->bucket_rows[p->buckets - 1], elements = 0, bytes = 0;
  if (!ipn_elements(p->input_shape, p->input_dims, &elements) || p->input_row_bytes == 0 ||
      p->input_row_bytes % (elements ? elements : 1) != 0 || !ipn_mul(rows, p->input_row_bytes, &bytes)) {
    return 0;
  }
  for (uint32_t k = 0; k < p->outputs; ++k) {
    if (p->output_dims[k] > IPN_MAX_DIMS || p->output_names[k][0] == 0 ||
        memchr(p->output_names[k], 0, sizeof p->output_names[k]) == NULL ||
        !ipn_elements(p->output_shapes[k], p->output_dims[k], &elements) ||
        !ipn_mul(rows, p->output_row_bytes[k], &bytes)) {
      return 0;
    }
  }
  return 1;
}

int ipn_open(void* instance, const ipn_spec* spec) {
  if (!ipn_load_driver()) return 1;
  if (!spec_fits(spec)) return 6;
  ipn_state* s = calloc(1, sizeof *s);
  if (s == NULL) return 4;
  s->instance = instance;
  s->spec = *spec;
  int device = 0;
  if (cu.DeviceGet(&device, spec->device) || cu.DevicePrimaryCtxRetain(&s->context, device) ||
      cu.CtxSetCurrent(s->context)) {
    release_memory(s);
    return 2;
  }
  int64_t room = spec->bucket_rows[spec->buckets - 1];
  for (int i = 0; i < IPN_SLOTS; ++i) {
    int failed = cu.EventCreate(&s->events[i], 2 /* CU_EVENT_DISABLE_TIMING */) ||
                 cu.MemAllocHost((void**)&s->staging[i], (size_t)room * spec->input_row_bytes);
    for (uint32_t k = 0; k < spec->outputs && !failed; ++k) {
      failed = cu.MemAllocHost((void**)&s->host_outputs[i][k], (size_t)room * spec->output_row_bytes[k]);
    }
    if (failed) {
      release_memory(s);
      return 3;
    }
  }
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->changed, NULL);
  if (pthread_create(&s->thread, NULL, complete, s) != 0) {
    release_memory(s);
    return 5;
  }
  pthread_mutex_lock(&registry_lock);
  int placed = 0;
  for (int i = 0; i < IPN_MAX_INSTANCES && !placed; ++i) {
    if (registry[i] == NULL) registry[i] = s, placed = 1;
  }
  pthread_mutex_unlock(&registry_lock);
  if (!placed) {
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    release_memory(s);
    return 4;
  }
  return 0;
}

/* Stops the instance's completion thread (after the batches in flight) and forgets it; counts[0..1]: batches
 * served natively, their requests. */
void ipn_close(void* instance, uint64_t* counts) {
  pthread_mutex_lock(&registry_lock);
  ipn_state* s = NULL;
  for (int i = 0; i < IPN_MAX_INSTANCES; ++i) {
    if (registry[i] != NULL && registry[i]->instance == instance) s = registry[i], registry[i] = NULL;
  }
  pthread_mutex_unlock(&registry_lock);
  if (s == NULL) return;
  pthread_mutex_lock(&s->lock);
  s->stopping = 1;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  if (counts) counts[0] = s->native_batches, counts[1] = s->native_requests;
  cu.CtxSetCurrent(s->context);
  release_memory(s);
}

/* How many batches and requests ran natively so far (counts as in ipn_close). */
void ipn_counts(void* instance, uint64_t* counts) {
  pthread_mutex_lock(&registry_lock);
  ipn_state* s = find(instance);
  if (s) counts[0] = s->native_batches, counts[1] = s->native_requests;
  pthread_mutex_unlock(&registry_lock);
}

static int take_slot(ipn_state* s) {
  pthread_mutex_lock(&s->lock);
  int slot = -1;
  while (slot < 0) {
    for (int i = 0; i < IPN_SLOTS && slot < 0; ++i) {
      if (!s->busy[i]) slot = i;
    }
    if (slot < 0) pthread_cond_wait(&s->changed, &s->lock);
  }
  s->busy[slot] = 1;
  pthread_mutex_unlock(&s->lock);
  return slot;
}

static int grow(ipn_batch* b, uint32_t count) {
  void** requests = realloc(b->requests, count * sizeof *requests);
  if (requests) b->requests = requests;
  int64_t* rows = realloc(b->rows, count * sizeof *rows);
  if (rows) b->rows = rows;
  TRITONBACKEND_Input** inputs = realloc(b->inputs, count * sizeof *inputs);
  if (inputs) b->inputs = inputs;
  return requests != NULL && rows != NULL && inputs != NULL;
}

/* Serves the batch natively and returns 1, or returns 0 without touching it (no native path for this instance): the
 * caller hands it to Python. */
int ipn_execute(void* instance, void** requests, uint32_t count) {
  pthread_mutex_lock(&registry_lock); /* Triton finalizes an instance only once its executes have returned */
  ipn_state* s = find(instance);
  pthread_mutex_unlock(&registry_lock);
  if (s == NULL) return 0;
  uint64_t started = ipn_now();
  const ipn_spec* p = &s->spec;
  int64_t room = p->bucket_rows[p->buckets - 1];
  char message[512];
  int slot = take_slot(s);
  ipn_batch* b = &s->batches[slot];
  if (!grow(b, count)) {
    pthread_mutex_lock(&s->lock);
    s->busy[slot] = 0;
    pthread_mutex_unlock(&s->lock);
    for (uint32_t r = 0; r < count; ++r) {
      if (requests[r]) ipn_refuse(s->instance, requests[r], ERROR_INTERNAL, "out of memory", started);
    }
    return 1;
  }
  b->count = 0, b->total = 0, b->exec_start = started, b->launched = 0, b->failed = 0;
  for (uint32_t r = 0; r < count; ++r) { /* first the checks: the batch's rows pick its bucket */
    if (requests[r] == NULL) continue;
    int64_t rows = 0;
    TRITONBACKEND_Input* input = NULL;
    if (!check_input(s, requests[r], &rows, &input, message, sizeof message)) {
      ipn_refuse(s->instance, requests[r], ERROR_INVALID_ARG, message, started);
      continue;
    }
    if (rows > room || b->total + rows > room) { /* Triton keeps batches within max_batch_size: never write past the staging */
      snprintf(message, sizeof message, "a batch of %lld rows exceeds the model's largest batch %lld",
               (long long)(b->total + rows), (long long)room);
      ipn_refuse(s->instance, requests[r], ERROR_INVALID_ARG, message, started);
      continue;
    }
    b->requests[b->count] = requests[r];
    b->inputs[b->count] = input;
    b->rows[b->count++] = rows;
    b->total += rows;
  }
  b->compute_start = ipn_now();
  if (b->total > 0) {
    uint32_t k = 0;
    while (p->bucket_rows[k] < b->total) k++;
    void* stream = (void*)(uintptr_t)p->stream;
    cu.CtxSetCurrent(s->context);
    ipn_cursor c = {s->staging[slot], p->static_inputs[k], 0, 0, (uint64_t)b->total * p->input_row_bytes, stream, 0};
    for (uint32_t r = 0; r < b->count; ++r) gather(b->inputs[r], &c);
    flush_host(&c);
    b->compute_start = ipn_now(); /* the input is read and on its way: the run's time starts */
    int failed = c.failed || c.at != (uint64_t)b->total * p->input_row_bytes ||
                 cu.GraphLaunch((void*)(uintptr_t)p->graphs[k], stream);
    for (uint32_t o = 0; o < p->outputs && !failed; ++o) {
      failed = cu.MemcpyDtoHAsync(s->host_outputs[slot][o], p->static_outputs[k][o],
                                  (size_t)b->total * p->output_row_bytes[o], stream);
    }
    failed = failed || cu.EventRecord(s->events[slot], stream);
    b->launched = 1;
    b->failed = failed != 0; /* the requests hear it from the completion thread */
  }
  s->native_batches++;
  s->native_requests += b->count;
  pthread_mutex_lock(&s->lock);
  s->queue[(s->head + s->queued) % IPN_SLOTS] = slot;
  s->queued++;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return 1;
}
