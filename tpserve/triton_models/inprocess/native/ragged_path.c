/* The native per-batch path of the in-process backend for sequence models: a dynamic batch of requests of any
 * lengths, under CUDA graphs over a grid of (rows x length) cells (triton_models/runtime/ragged_runner.py).
 *
 * Python loads the model, compiles it, captures a graph for every cell and measures the smallest run's cost
 * (min_run_tokens) when the instance starts; it then hands this file the grid, each cell's graph executable and
 * static buffers' device addresses, the instance's stream, and the inputs' and outputs' names, datatypes and
 * shapes (ipr_open). From there on Triton's execute for that instance never enters the interpreter:
 *
 *   execute (Triton's thread): check every request's inputs (datatype, [rows, tokens], one shape for all,
 *     length, bytes, value_range), find each row's real length (its mask's last non-zero entry), plan the batch
 *     exactly as ragged.plan does (rows sorted by length, neighbouring length buckets merged where a run's floor
 *     cost says so, cut by the token budget), gather each group's rows at its cell's shape into a slot's pinned
 *     staging and queue on the stream: a host-to-device copy per input, cuGraphLaunch, a device-to-host copy per
 *     output, an event; hand the batch to the completion thread and return;
 *   completion thread: wait for the event, write each request's own rows (a per-token output cut to the
 *     request's own width) into its response, send them all, then report statistics and release.
 *
 * A request that cannot be valid hears why and is released at execute; the batch goes on without it. Inputs in
 * device memory (the client's CUDA shared memory) are copied to the host first, outputs Triton places there are
 * copied to the device. Nothing here holds the GIL.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ragged_path.h"
#include "metrics.h"
#include "native.h"
#include "ragged_plan.h"
#include "specs.h"

enum {
  IPR_SLOTS = 2,
  IPR_MAX_INSTANCES = 64,
  IPR_SPLIT_AT = 8,  /* requests in a batch from which two threads send the answers */
  IPR_RELEASERS = 2, /* threads that report statistics and release (Triton reports one request at a time) */
  IPR_BACKLOG = 4,   /* answered batches that may wait for their statistics and release */
  IPR_COUNTS = 6,    /* counters of work: batches, requests, rows, real tokens, computed tokens, runs */
  IPR_TIMERS = 6,    /* counters of ns, after them: read, plan+stage+launch, slot wait, GPU wait, answer, release */
  IPR_COUNTERS = IPR_COUNTS + IPR_TIMERS
};
enum { T_READ = IPR_COUNTS, T_LAUNCH, T_SLOT, T_GPU, T_ANSWER, T_RELEASE };

/* An answered batch's requests, waiting for their statistics and release (the release threads'). */
typedef struct {
  void** requests;
  uint8_t* sent;
  uint32_t count;
  uint64_t rows, exec_start, compute_start, compute_end, answered; /* answered: every answer sent */
} ipr_release;

/* --- one instance */

typedef struct {
  void* request;
  int64_t rows, width, first; /* first: its first row in the batch */
  int sent;                   /* its response went out whole */
  const char* data[IPR_MAX_INPUTS]; /* each input's [rows, width] elements, contiguous in host memory */
  char* owned[IPR_MAX_INPUTS];      /* ours to free (the input was split or in device memory) */
} ipr_request;

typedef struct {
  ipr_request* requests; /* the batch's requests that run (others were answered at execute) */
  uint32_t count, room;
  int64_t total;                                /* rows */
  /* per row: its real length, its plan position, its group, its request; order: the rows in plan order */
  int64_t *lengths, *at, *group, *owner, *order;
  /* per group: its length, rows, first plan position, first token of its per-token outputs */
  int64_t *length, *in_group, *group_start, *tokens_at;
  int64_t row_room;
  int64_t groups;
  uint64_t exec_start, compute_start;
  int launched, failed;
  char* staging[IPR_MAX_INPUTS];
  uint64_t staging_room[IPR_MAX_INPUTS];
  char* host_outputs[IPR_MAX_OUTPUTS];
  uint64_t host_room[IPR_MAX_OUTPUTS];
  void* event;
} ipr_batch;

typedef struct {
  void* instance;
  ipr_spec spec;
  void* context;
  ipr_batch batches[IPR_SLOTS];
  int busy[IPR_SLOTS];
  int queue[IPR_SLOTS], head, queued;
  int stopping, helper_stopping, releases_stopping;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  pthread_t thread, helper, releasers[IPR_RELEASERS];
  int helpers_started, releasers_started;
  ipr_batch* helper_batch; /* the helper answers requests [helper_from, helper_to) of it; NULL: nothing asked */
  uint32_t helper_from, helper_to;
  ipr_release releases[IPR_BACKLOG];
  int release_head, releases_queued;
  /* batches, requests, rows, real tokens, computed tokens, runs; then ns spent (IPR_TIMERS): reading and checking
   * the requests, planning, staging and launching, waiting for a free slot, waiting for the GPU, answering,
   * reporting statistics and releasing */
  uint64_t counters[IPR_COUNTERS];
} ipr_state;

static ipr_state* registry[IPR_MAX_INSTANCES];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* ns since `from` added to a timer (release threads share theirs: atomic); returns now. */
static uint64_t spent(ipr_state* s, int timer, uint64_t from) {
  uint64_t now = ipn_now();
  __atomic_fetch_add(&s->counters[timer], now - from, __ATOMIC_RELAXED);
  return now;
}

static ipr_state* find(void* instance) {
  for (int i = 0; i < IPR_MAX_INSTANCES; ++i) {
    if (registry[i] != NULL && registry[i]->instance == instance) return registry[i];
  }
  return NULL;
}

static int is_integer(int dtype) { return dtype >= 2 && dtype <= 9; } /* UINT8 .. INT64 */

static int64_t read_integer(const char* at, int dtype) {
  switch (dtype) {
    case 2: return *(const uint8_t*)at;
    case 3: return *(const uint16_t*)at;
    case 4: return *(const uint32_t*)at;
    case 5: return (int64_t)(*(const uint64_t*)at > INT64_MAX ? INT64_MAX : *(const uint64_t*)at);
    case 6: return *(const int8_t*)at;
    case 7: return *(const int16_t*)at;
    case 8: return *(const int32_t*)at;
    default: return *(const int64_t*)at;
  }
}

static void free_owned(ipr_request* q) {
  for (int i = 0; i < IPR_MAX_INPUTS; ++i) free(q->owned[i]), q->owned[i] = NULL;
}

/* The input's bytes, copied once into memory of our own (from host or device memory, one buffer or several): the
 * checks and the run read the copy, never the client's buffer, which a writer of its shared memory may change
 * between the two. 0: why not is in message. */
static int host_bytes(ipr_state* s, TRITONBACKEND_Input* input, uint32_t buffers, uint64_t size, ipr_request* q,
                      int i, char* message, size_t room) {
  const char* name = s->spec.input_names[i];
  const void* base = NULL;
  uint64_t bytes = 0;
  int memory = 0;
  int64_t device = 0;
  char* copy = malloc(size ? size : 1);
  if (copy == NULL) {
    snprintf(message, room, "input %s: out of memory", name);
    return 0;
  }
  q->owned[i] = copy, q->data[i] = copy;
  uint64_t at = 0;
  void* stream = (void*)(uintptr_t)s->spec.stream;
  for (uint32_t b = 0; b < buffers; ++b) {
    if (!ipn_ok(TRITONBACKEND_InputBuffer(input, b, &base, &bytes, &memory, &device)) || bytes > size - at) {
      snprintf(message, room, "input %s: buffer %u unreadable or longer than its shape", name, b);
      return 0;
    }
    if (memory == MEMORY_GPU) {
      if (cu.MemcpyDtoHAsync(copy + at, (uint64_t)(uintptr_t)base, bytes, stream) || cu.StreamSynchronize(stream)) {
        snprintf(message, room, "input %s: copying it from device memory failed", name);
        return 0;
      }
    } else {
      memcpy(copy + at, base, bytes);
    }
    at += bytes;
  }
  if (at != size) {
    snprintf(message, room, "input %s: its buffers hold %llu bytes, its shape %llu", name, (unsigned long long)at,
             (unsigned long long)size);
    return 0;
  }
  return 1;
}

/* 1: the request's inputs are what the model takes (q filled); 0: why not is in message. */
static int check_request(ipr_state* s, void* request, ipr_request* q, char* message, size_t room) {
  const ipr_spec* p = &s->spec;
  int64_t longest = p->grid.length_buckets[p->grid.lengths - 1];
  memset(q, 0, sizeof *q);
  q->request = request;
  for (uint32_t i = 0; i < p->inputs; ++i) {
    TRITONBACKEND_Input* input = NULL;
    const char* name = NULL;
    const int64_t* shape = NULL;
    uint32_t dims = 0, buffers = 0;
    uint64_t size = 0;
    int dtype = 0;
    if (!ipn_ok(TRITONBACKEND_RequestInput(request, p->input_names[i], &input)) ||
        !ipn_ok(TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &dims, &size, &buffers))) {
      snprintf(message, room, "input %s is missing", p->input_names[i]);
      return 0;
    }
    if (dtype != p->input_dtypes[i]) {
      snprintf(message, room, "input %s: %s, the model takes %s", p->input_names[i], ipn_dtype_name(dtype),
               ipn_dtype_name(p->input_dtypes[i]));
      return 0;
    }
    if (dims != 2 || shape[0] < 0 || shape[1] < 0) {
      snprintf(message, room, "input %s: the model takes [rows, tokens]; send a two-dimensional tensor",
               p->input_names[i]);
      return 0;
    }
    if (i == 0) {
      q->rows = shape[0], q->width = shape[1];
    } else if (shape[0] != q->rows || shape[1] != q->width) {
      snprintf(message, room, "the inputs of one request must have one shape: %s [%lld, %lld], %s [%lld, %lld]",
               p->input_names[0], (long long)q->rows, (long long)q->width, p->input_names[i], (long long)shape[0],
               (long long)shape[1]);
      return 0;
    }
    if (q->width > longest) {
      snprintf(message, room, "%s: %lld tokens per row exceed the model's longest length %lld; truncate to %lld tokens",
               p->input_names[i], (long long)q->width, (long long)longest, (long long)longest);
      return 0;
    }
    uint64_t expected = 0;
    if (q->rows > IPN_MAX_ROWS) {
      snprintf(message, room, "input %s: %lld rows in one request, at most %d", p->input_names[i], (long long)q->rows,
               (int)IPN_MAX_ROWS);
      return 0;
    }
    if (!ipn_mul((uint64_t)(q->rows * q->width), p->input_bytes[i], &expected) || size != expected) {
      snprintf(message, room, "input %s: %llu bytes for shape [%lld, %lld]", p->input_names[i],
               (unsigned long long)size, (long long)q->rows, (long long)q->width);
      return 0;
    }
    if (!host_bytes(s, input, buffers, size, q, (int)i, message, room)) return 0;
  }
  for (uint32_t i = 0; i < p->inputs; ++i) { /* a token id beyond the vocabulary would fault the GPU */
    if (!p->bounded[i] || !is_integer(p->input_dtypes[i])) continue;
    const char* at = q->data[i];
    for (int64_t e = 0; e < q->rows * q->width; ++e, at += p->input_bytes[i]) {
      int64_t v = read_integer(at, p->input_dtypes[i]);
      if (v < p->low[i] || v >= p->high[i]) {
        snprintf(message, room, "input %s: values must lie in [%lld, %lld) (the model's value_range): row %lld holds %lld",
                 p->input_names[i], (long long)p->low[i], (long long)p->high[i],
                 (long long)(e / (q->width > 0 ? q->width : 1)), (long long)v);
        return 0;
      }
    }
  }
  return 1;
}

/* Each row's real length: its mask's last non-zero entry, plus one (at least 1); without a mask, its width. */
static void row_lengths(const ipr_spec* p, const ipr_request* q, int64_t* out) {
  if (p->mask < 0) {
    for (int64_t r = 0; r < q->rows; ++r) out[r] = q->width;
    return;
  }
  uint32_t unit = p->input_bytes[p->mask];
  for (int64_t r = 0; r < q->rows; ++r) {
    const char* row = q->data[p->mask] + (uint64_t)(r * q->width) * unit;
    int64_t length = 1;
    for (int64_t t = q->width; t-- > 0;) {
      const char* e = row + (uint64_t)t * unit;
      int nonzero = 0;
      for (uint32_t b = 0; b < unit && !nonzero; ++b) nonzero = e[b] != 0;
      if (nonzero) {
        length = t + 1;
        break;
      }
    }
    out[r] = length;
  }
}

static int grow_rows(ipr_batch* b, int64_t rows) {
  if (rows <= b->row_room) return 1;
  int64_t room = rows * 2;
  int64_t** fields[] = {&b->lengths, &b->at,       &b->group,       &b->owner,
                        &b->order,   &b->length, &b->in_group, &b->group_start, &b->tokens_at};
  for (size_t f = 0; f < sizeof fields / sizeof *fields; ++f) {
    int64_t* grown = realloc(*fields[f], (size_t)room * sizeof(int64_t));
    if (grown == NULL) return 0;
    *fields[f] = grown;
  }
  b->row_room = room;
  return 1;
}

static int grow_requests(ipr_batch* b, uint32_t count) {
  if (count <= b->room) return 1;
  ipr_request* grown = realloc(b->requests, count * sizeof *grown);
  if (grown == NULL) return 0;
  b->requests = grown, b->room = count;
  return 1;
}

/* The batch's groups, staged and queued on the stream: 0 when a driver call failed. */
static int launch(ipr_state* s, ipr_batch* b) {
  const ipr_spec* p = &s->spec;
  void* stream = (void*)(uintptr_t)p->stream;
  /* where each plan position's rows go, and the bytes every buffer needs */
  uint64_t staged[IPR_MAX_INPUTS] = {0}, outputs[IPR_MAX_OUTPUTS] = {0};
  int64_t position = 0, tokens = 0;
  for (int64_t k = 0; k < b->groups; ++k) {
    int64_t bucket = ipr_bucket_at_least(p->grid.length_buckets, p->grid.lengths, b->length[k]);
    int64_t rows_bucket = ipr_bucket_at_least(p->grid.batch_buckets, p->grid.batches, b->in_group[k]);
    int32_t cell = p->cell_of[bucket][rows_bucket];
    if (cell < 0) return 0;
    int64_t cell_rows = p->grid.batch_buckets[rows_bucket];
    for (uint32_t i = 0; i < p->inputs; ++i) staged[i] += (uint64_t)(cell_rows * b->length[k]) * p->input_bytes[i];
    for (int64_t j = 0; j < b->in_group[k]; ++j) b->at[b->order[position + j]] = position + j;
    for (int64_t j = 0; j < b->in_group[k]; ++j) b->group[b->order[position + j]] = k;
    b->tokens_at[k] = tokens, b->group_start[k] = position;
    position += b->in_group[k];
    tokens += b->in_group[k] * b->length[k];
    s->counters[4] += (uint64_t)(cell_rows * b->length[k]);
  }
  for (uint32_t o = 0; o < p->outputs; ++o) {
    outputs[o] = (uint64_t)(p->per_token[o] ? tokens : b->total) * p->output_unit_bytes[o];
  }
  for (uint32_t i = 0; i < p->inputs; ++i) {
    if (!ipn_pinned(&b->staging[i], &b->staging_room[i], staged[i])) return 0;
  }
  for (uint32_t o = 0; o < p->outputs; ++o) {
    if (!ipn_pinned(&b->host_outputs[o], &b->host_room[o], outputs[o])) return 0;
  }
  uint64_t offset[IPR_MAX_INPUTS] = {0};
  position = 0;
  for (int64_t k = 0; k < b->groups; ++k) {
    int64_t bucket = ipr_bucket_at_least(p->grid.length_buckets, p->grid.lengths, b->length[k]);
    int64_t rows_bucket = ipr_bucket_at_least(p->grid.batch_buckets, p->grid.batches, b->in_group[k]);
    int32_t cell = p->cell_of[bucket][rows_bucket];
    int64_t cell_rows = p->grid.batch_buckets[rows_bucket], length = b->length[k];
    for (uint32_t i = 0; i < p->inputs; ++i) {
      uint32_t unit = p->input_bytes[i];
      char* block = b->staging[i] + offset[i];
      for (int64_t j = 0; j < b->in_group[k]; ++j) {
        int64_t row = b->order[position + j];
        const ipr_request* q = &b->requests[b->owner[row]];
        int64_t width = q->width < length ? q->width : length;
        char* to = block + (uint64_t)(j * length) * unit;
        memcpy(to, q->data[i] + (uint64_t)((row - q->first) * q->width) * unit, (size_t)width * unit);
        memset(to + (uint64_t)width * unit, 0, (size_t)(length - width) * unit);
      }
      uint64_t bytes = (uint64_t)(cell_rows * length) * unit;
      memset(block + (uint64_t)(b->in_group[k] * length) * unit, 0,
             (size_t)((cell_rows - b->in_group[k]) * length) * unit);
      if (cu.MemcpyHtoDAsync(p->static_inputs[cell][i], block, bytes, stream)) return 0;
      offset[i] += bytes;
    }
    if (cu.GraphLaunch((void*)(uintptr_t)p->graphs[cell], stream)) return 0;
    for (uint32_t o = 0; o < p->outputs; ++o) {
      uint64_t unit = p->output_unit_bytes[o];
      uint64_t at = p->per_token[o] ? (uint64_t)b->tokens_at[k] * unit : (uint64_t)position * unit;
      uint64_t bytes = (uint64_t)(b->in_group[k] * (p->per_token[o] ? length : 1)) * unit;
      if (bytes && cu.MemcpyDtoHAsync(b->host_outputs[o] + at, p->static_outputs[cell][o], bytes, stream)) return 0;
    }
    position += b->in_group[k];
  }
  s->counters[5] += (uint64_t)b->groups;
  return cu.EventRecord(b->event, stream) == 0;
}

/* One request's rows of one output, written into `to` (its response's buffer or a host copy of it). */
static void place(const ipr_spec* p, const ipr_batch* b, const ipr_request* q, uint32_t o, char* to) {
  uint64_t unit = p->output_unit_bytes[o];
  for (int64_t r = 0; r < q->rows; ++r) {
    int64_t row = q->first + r;
    if (!p->per_token[o]) {
      memcpy(to + (uint64_t)r * unit, b->host_outputs[o] + (uint64_t)b->at[row] * unit, unit);
      continue;
    }
    int64_t k = b->group[row], length = b->length[k], index = b->at[row] - b->group_start[k];
    int64_t width = q->width < length ? q->width : length;
    char* line = to + (uint64_t)(r * q->width) * unit;
    memcpy(line, b->host_outputs[o] + (uint64_t)(b->tokens_at[k] + index * length) * unit, (size_t)width * unit);
    memset(line + (uint64_t)width * unit, 0, (size_t)(q->width - width) * unit);
  }
}

/* One request's outputs into its response, sent; 1 when it went out whole. */
static int answer(ipr_state* s, ipr_batch* b, const ipr_request* q) {
  const ipr_spec* p = &s->spec;
  void* response = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, q->request);
  for (uint32_t o = 0; o < p->outputs && err == NULL; ++o) {
    if (!ipn_wanted_output(q->request, p->output_names[o], p->outputs)) continue;
    int64_t shape[IPR_MAX_DIMS + 2];
    uint32_t dims = 0;
    shape[dims++] = q->rows;
    if (p->per_token[o]) shape[dims++] = q->width;
    for (uint32_t d = 0; d < p->output_dims[o]; ++d) shape[dims++] = p->output_shapes[o][d];
    uint64_t bytes = (uint64_t)(q->rows * (p->per_token[o] ? q->width : 1)) * p->output_unit_bytes[o];
    void* output = NULL;
    void* buffer = NULL;
    int memory = 0;
    int64_t device = 0;
    err = TRITONBACKEND_ResponseOutput(response, &output, p->output_names[o], p->output_dtypes[o], shape, dims);
    if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory, &device);
    if (err != NULL || bytes == 0) continue;
    if (memory != MEMORY_GPU) {
      place(p, b, q, o, buffer);
      continue;
    }
    char* host = malloc(bytes); /* the client's CUDA shared memory: placed here, then one copy to the device */
    void* stream = (void*)(uintptr_t)p->stream;
    if (host != NULL) place(p, b, q, o, host);
    if (host == NULL || cu.MemcpyHtoDAsync((uint64_t)(uintptr_t)buffer, host, bytes, stream) ||
        cu.StreamSynchronize(stream)) {
      err = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "copying an output into device memory failed");
    }
    free(host);
  }
  if (response != NULL) ipn_ok(TRITONBACKEND_ResponseSend(response, COMPLETE_FINAL, err));
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
  return err == NULL && response != NULL;
}

static void answer_range(ipr_state* s, ipr_batch* b, uint32_t from, uint32_t to) {
  for (uint32_t r = from; r < to; ++r) b->requests[r].sent = answer(s, b, &b->requests[r]);
}

/* Every request of the batch answered: a batch of many by two threads, half each (Triton's send costs about 20 µs
 * a request over gRPC). */
static void answer_all(ipr_state* s, ipr_batch* b) {
  if (b->count < IPR_SPLIT_AT || !s->helpers_started) return answer_range(s, b, 0, b->count);
  uint32_t half = b->count / 2;
  pthread_mutex_lock(&s->lock);
  s->helper_batch = b, s->helper_from = half, s->helper_to = b->count;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  answer_range(s, b, 0, half);
  pthread_mutex_lock(&s->lock);
  while (s->helper_batch != NULL) pthread_cond_wait(&s->changed, &s->lock);
  pthread_mutex_unlock(&s->lock);
}

static void* help(void* arg) {
  ipr_state* s = arg;
  cu.CtxSetCurrent(s->context);
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (s->helper_batch == NULL && !s->helper_stopping) pthread_cond_wait(&s->changed, &s->lock);
    if (s->helper_batch == NULL) break;
    ipr_batch* b = s->helper_batch;
    uint32_t from = s->helper_from, to = s->helper_to;
    pthread_mutex_unlock(&s->lock);
    answer_range(s, b, from, to);
    pthread_mutex_lock(&s->lock);
    s->helper_batch = NULL;
    pthread_cond_broadcast(&s->changed);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static void release_now(ipr_state* s, const ipr_release* job) {
  uint64_t began = ipn_now();
  for (uint32_t r = 0; r < job->count; ++r) {
    ipn_report(s->instance, job->requests[r], job->sent[r], job->exec_start, job->compute_start, job->compute_end,
               ipn_now(), job->answered);
    ipn_ok(TRITONBACKEND_RequestRelease(job->requests[r], RELEASE_ALL));
  }
  if (job->count) {
    ipn_ok(TRITONBACKEND_ModelInstanceReportBatchStatistics(s->instance, job->rows, job->exec_start,
                                                            job->compute_start, job->compute_end, ipn_now()));
  }
  free(job->requests);
  free(job->sent);
  spent(s, T_RELEASE, began);
}

/* The answered batch's requests handed to the release threads (the client has its answer already; Triton's
 * statistics cost more than the answer); where they fall behind, this waits (a bounded backlog). */
static void hand_to_release(ipr_state* s, const ipr_batch* b, uint64_t compute_end) {
  ipr_release job = {malloc(b->count * sizeof(void*)), malloc(b->count ? b->count : 1), b->count, (uint64_t)b->total,
                     b->exec_start, b->compute_start, compute_end, ipn_now()};
  if (job.requests == NULL || job.sent == NULL || !s->releasers_started) { /* released here */
    free(job.requests), free(job.sent);
    for (uint32_t r = 0; r < b->count; ++r) {
      ipn_report(s->instance, b->requests[r].request, b->requests[r].sent, job.exec_start, job.compute_start,
                 compute_end, ipn_now(), job.answered);
      ipn_ok(TRITONBACKEND_RequestRelease(b->requests[r].request, RELEASE_ALL));
    }
    return;
  }
  for (uint32_t r = 0; r < b->count; ++r) job.requests[r] = b->requests[r].request, job.sent[r] = b->requests[r].sent;
  pthread_mutex_lock(&s->lock);
  while (s->releases_queued == IPR_BACKLOG) pthread_cond_wait(&s->changed, &s->lock);
  s->releases[(s->release_head + s->releases_queued) % IPR_BACKLOG] = job;
  s->releases_queued++;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
}

static void* release_loop(void* arg) {
  ipr_state* s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->releases_queued && !s->releases_stopping) pthread_cond_wait(&s->changed, &s->lock);
    if (!s->releases_queued) break;
    ipr_release job = s->releases[s->release_head];
    s->release_head = (s->release_head + 1) % IPR_BACKLOG;
    s->releases_queued--;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    release_now(s, &job);
    pthread_mutex_lock(&s->lock);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static void finish(ipr_state* s, int slot) {
  ipr_batch* b = &s->batches[slot];
  uint64_t waited = ipn_now();
  int ran = !b->failed && (!b->launched || cu.EventSynchronize(b->event) == 0);
  uint64_t compute_end = spent(s, T_GPU, waited);
  if (!ran) {
    for (uint32_t r = 0; r < b->count; ++r) {
      ipn_refuse(s->instance, b->requests[r].request, ERROR_INTERNAL, "the batch failed on the device", b->exec_start);
      free_owned(&b->requests[r]);
    }
    return;
  }
  answer_all(s, b); /* every answer first: the statistics can wait, a client cannot */
  spent(s, T_ANSWER, compute_end);
  for (uint32_t r = 0; r < b->count; ++r) free_owned(&b->requests[r]);
  hand_to_release(s, b, compute_end);
}

static void release_memory(ipr_state* s) {
  for (int k = 0; k < IPR_SLOTS; ++k) {
    ipr_batch* b = &s->batches[k];
    if (b->event) cu.EventDestroy(b->event);
    for (int i = 0; i < IPR_MAX_INPUTS; ++i) {
      if (b->staging[i]) cu.MemFreeHost(b->staging[i]);
    }
    for (int o = 0; o < IPR_MAX_OUTPUTS; ++o) {
      if (b->host_outputs[o]) cu.MemFreeHost(b->host_outputs[o]);
    }
    free(b->requests);
    int64_t* fields[] = {b->lengths, b->at,       b->group,       b->owner,    b->order,
                         b->length,  b->in_group, b->group_start, b->tokens_at};
    for (size_t f = 0; f < sizeof fields / sizeof *fields; ++f) free(fields[f]);
  }
  free(s);
}

static void* complete(void* arg) {
  ipr_state* s = arg;
  cu.CtxSetCurrent(s->context);
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->queued && !s->stopping) pthread_cond_wait(&s->changed, &s->lock);
    if (!s->queued) break;
    int slot = s->queue[s->head];
    s->head = (s->head + 1) % IPR_SLOTS;
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

/* Stops the threads in order, each after its work: the completion thread (the batches in flight), the helper,
 * then the release threads (the batches answered). */
static void stop_threads(ipr_state* s) {
  pthread_mutex_lock(&s->lock);
  s->stopping = 1;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&s->lock);
  s->helper_stopping = 1;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  if (s->helpers_started) pthread_join(s->helper, NULL);
  pthread_mutex_lock(&s->lock);
  s->releases_stopping = 1;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  for (int k = 0; k < s->releasers_started; ++k) pthread_join(s->releasers[k], NULL);
}

static int named(const char* name, size_t room) { return name[0] != 0 && memchr(name, 0, room) != NULL; }

static int ascending(const int64_t* values, uint32_t count) {
  for (uint32_t k = 0; k < count; ++k) {
    if (values[k] < 1 || (k && values[k] <= values[k - 1])) return 0;
  }
  return 1;
}

static int element_bytes(int32_t dtype) {
  static const int bytes[] = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 0, 2};
  return dtype >= 0 && dtype <= 14 ? bytes[dtype] : 0;
}

/* The whole spec Python handed over, checked before any of it is used: bounds, names, buckets ascending, every
 * cell a plan can pick present. */
static int spec_fits(const ipr_spec* p) {
  const ipr_grid* g = &p->grid;
  if (g->lengths == 0 || g->lengths > IPR_MAX_LENGTHS || g->batches == 0 || g->batches > IPR_MAX_BATCHES) return 0;
  if (p->inputs == 0 || p->inputs > IPR_MAX_INPUTS || p->outputs == 0 || p->outputs > IPR_MAX_OUTPUTS) return 0;
  if (p->cells == 0 || p->cells > IPR_MAX_CELLS || p->mask < -1 || p->mask >= (int32_t)p->inputs) return 0;
  if (!ascending(g->length_buckets, g->lengths) || !ascending(g->batch_buckets, g->batches)) return 0;
  if (g->min_run_tokens < 0 || g->batch_buckets[g->batches - 1] > IPN_MAX_ROWS) return 0;
  if (g->length_buckets[g->lengths - 1] > IPN_MAX_ROWS) return 0;
  for (uint32_t k = 0; k < g->lengths; ++k) { /* a group never holds more rows than the largest batch bucket */
    if (g->rows_at[k] < 1 || g->rows_at[k] > g->batch_buckets[g->batches - 1]) return 0;
  }
  for (uint32_t i = 0; i < p->inputs; ++i) {
    if (p->input_bytes[i] == 0 || p->input_bytes[i] != (uint32_t)element_bytes(p->input_dtypes[i])) return 0;
    if (!named(p->input_names[i], sizeof p->input_names[i]) || p->low[i] > p->high[i]) return 0;
  }
  for (uint32_t o = 0; o < p->outputs; ++o) {
    if (p->output_dims[o] > IPR_MAX_DIMS || p->output_unit_bytes[o] == 0) return 0;
    if (!named(p->output_names[o], sizeof p->output_names[o])) return 0;
  }
  for (uint32_t k = 0; k < g->lengths; ++k) { /* every cell a plan can pick exists */
    for (uint32_t j = 0; j < g->batches && (j == 0 || g->batch_buckets[j - 1] < g->rows_at[k]); ++j) {
      if (p->cell_of[k][j] < 0 || p->cell_of[k][j] >= (int32_t)p->cells) return 0;
    }
  }
  return 1;
}

/* Registers the native path for instance; 0 on success, else a reason code (native_path.REASONS). */
int ipr_open(void* instance, const ipr_spec* spec) {
  if (!ipn_load_driver()) return 1;
  if (!spec_fits(spec)) return 6;
  ipr_state* s = calloc(1, sizeof *s);
  if (s == NULL) return 4;
  s->instance = instance;
  s->spec = *spec;
  int device = 0;
  if (cu.DeviceGet(&device, spec->device) || cu.DevicePrimaryCtxRetain(&s->context, device) ||
      cu.CtxSetCurrent(s->context)) {
    release_memory(s);
    return 2;
  }
  for (int k = 0; k < IPR_SLOTS; ++k) {
    if (cu.EventCreate(&s->batches[k].event, 2 /* CU_EVENT_DISABLE_TIMING */)) {
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
  s->helpers_started = pthread_create(&s->helper, NULL, help, s) == 0; /* without it: one thread answers */
  for (int k = 0; k < IPR_RELEASERS; ++k) {
    s->releasers_started += pthread_create(&s->releasers[s->releasers_started], NULL, release_loop, s) == 0;
  }
  pthread_mutex_lock(&registry_lock);
  int placed = 0;
  for (int i = 0; i < IPR_MAX_INSTANCES && !placed; ++i) {
    if (registry[i] == NULL) registry[i] = s, placed = 1;
  }
  pthread_mutex_unlock(&registry_lock);
  if (placed) return 0;
  stop_threads(s);
  release_memory(s);
  return 4;
}

/* counts: batches, requests, rows, real tokens, computed tokens (with the padding), runs; then the timers' ns. */
static void copy_counts(const ipr_state* s, uint64_t* counts) {
  for (int k = 0; k < IPR_COUNTERS; ++k) counts[k] = __atomic_load_n(&s->counters[k], __ATOMIC_RELAXED);
}

/* Stops the instance's completion thread (after the batches in flight) and forgets it; counts as ipr_counts. */
void ipr_close(void* instance, uint64_t* counts) {
  pthread_mutex_lock(&registry_lock);
  ipr_state* s = NULL;
  for (int i = 0; i < IPR_MAX_INSTANCES; ++i) {
    if (registry[i] != NULL && registry[i]->instance == instance) s = registry[i], registry[i] = NULL;
  }
  pthread_mutex_unlock(&registry_lock);
  if (s == NULL) return;
  stop_threads(s);
  if (counts) copy_counts(s, counts);
  cu.CtxSetCurrent(s->context);
  release_memory(s);
}

/* What the instance served natively so far (copy_counts); untouched when it has no native path. */
void ipr_counts(void* instance, uint64_t* counts) {
  pthread_mutex_lock(&registry_lock);
  ipr_state* s = find(instance);
  if (s) copy_counts(s, counts);
  pthread_mutex_unlock(&registry_lock);
}

static int take_slot(ipr_state* s) {
  pthread_mutex_lock(&s->lock);
  int slot = -1;
  while (slot < 0) {
    for (int i = 0; i < IPR_SLOTS && slot < 0; ++i) {
      if (!s->busy[i]) slot = i;
    }
    if (slot < 0) pthread_cond_wait(&s->changed, &s->lock);
  }
  s->busy[slot] = 1;
  pthread_mutex_unlock(&s->lock);
  return slot;
}

static void hand_over(ipr_state* s, int slot) {
  pthread_mutex_lock(&s->lock);
  s->queue[(s->head + s->queued) % IPR_SLOTS] = slot;
  s->queued++;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
}

/* Serves the batch natively and returns 1, or returns 0 without touching it (no native path for this instance). */
int ipr_execute(void* instance, void** requests, uint32_t count) {
  pthread_mutex_lock(&registry_lock); /* Triton finalizes an instance only once its executes have returned */
  ipr_state* s = find(instance);
  pthread_mutex_unlock(&registry_lock);
  if (s == NULL) return 0;
  uint64_t started = ipn_now();
  const ipr_spec* p = &s->spec;
  char message[512];
  int slot = take_slot(s);
  uint64_t slotted = spent(s, T_SLOT, started); /* Triton's statistics count the wait as the batch's */
  ipr_batch* b = &s->batches[slot];
  b->count = 0, b->total = 0, b->groups = 0, b->exec_start = started, b->launched = 0, b->failed = 0;
  cu.CtxSetCurrent(s->context);
  if (!grow_requests(b, count)) {
    for (uint32_t r = 0; r < count; ++r) {
      if (requests[r]) ipn_refuse(instance, requests[r], ERROR_INTERNAL, "out of memory", started);
    }
    hand_over(s, slot);
    return 1;
  }
  for (uint32_t r = 0; r < count; ++r) { /* the checks: a request that cannot be valid is refused alone */
    if (requests[r] == NULL) continue;
    ipr_request* q = &b->requests[b->count];
    int valid = check_request(s, requests[r], q, message, sizeof message);
    if (valid && b->total + q->rows > IPN_MAX_ROWS) {
      snprintf(message, sizeof message, "a batch of %lld rows exceeds %d", (long long)(b->total + q->rows),
               (int)IPN_MAX_ROWS);
      valid = 0;
    }
    int room = valid && grow_rows(b, b->total + q->rows);
    if (!room) {
      free_owned(q);
      ipn_refuse(instance, requests[r], valid ? ERROR_INTERNAL : ERROR_INVALID_ARG, valid ? "out of memory" : message,
                 started);
      continue;
    }
    q->first = b->total;
    row_lengths(p, q, b->lengths + b->total);
    for (int64_t k = 0; k < q->rows; ++k) b->owner[b->total + k] = b->count;
    b->total += q->rows;
    b->count++;
  }
  b->compute_start = spent(s, T_READ, slotted);
  if (b->total > 0) {
    int64_t groups = ipr_plan(&p->grid, b->lengths, b->total, b->order, b->length, b->in_group);
    b->groups = groups;
    b->failed = groups < 0 || !launch(s, b);
    b->launched = !b->failed;
    if (b->failed) cu.StreamSynchronize((void*)(uintptr_t)p->stream); /* nothing queued still reads the slot */
    b->compute_start = spent(s, T_LAUNCH, b->compute_start); /* the inputs are on their way: the run starts */
    uint64_t real = 0;
    for (int64_t r = 0; r < b->total; ++r) real += (uint64_t)b->lengths[r];
    s->counters[2] += (uint64_t)b->total, s->counters[3] += real;
  }
  s->counters[0]++, s->counters[1] += b->count;
  hand_over(s, slot);
  return 1;
}
