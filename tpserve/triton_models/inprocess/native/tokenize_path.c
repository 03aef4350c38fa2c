/* The tokenize step's native per-batch path: a BERT-style tokenizer read in C (bert_tokenize.c) for texts of
 * printable ASCII, the batch answered, reported and released with no Python.
 *
 * Python loads tokenizer.json when the instance starts and hands this file the vocabulary, the special tokens and
 * the truncation (triton_models/inprocess/native_tokenize.py, which also decides whether the tokenizer is BERT-style). Each
 * request's answer is its texts' ids and mask, [its texts, its longest text], zeros after a text's own.
 *
 * A batch is served here only when every text of every request is such a text, non-blank and free of an added
 * token's text ([CLS], [MASK]: the tokenizer matches those in the raw text first); else ipt_execute returns 0
 * having answered nothing, and the Python path serves the batch (and refuses a bad request alone, saying why). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize_path.h"
#include "bert_tokenize.h"
#include "metrics.h"
#include "native.h"

enum { IPT_MAX_INSTANCES = 256, IPT_COUNTERS = 4 };
enum { DTYPE_INT32 = 8, DTYPE_INT64 = 9, DTYPE_BYTES = 13 };

typedef struct {
  void* request;
  uint64_t text;    /* where the request's TEXT starts in the state's copy (read once from the client's buffer) */
  uint64_t bytes;   /* its bytes there */
  uint64_t texts;   /* its elements */
  uint64_t first;   /* its first text's place in the batch's lengths */
  int64_t width;    /* its longest text, in ids */
  int sent;
} ipt_request;

typedef struct {
  void* instance;
  ipt_vocab vocab;
  /* the batch being served (an instance runs one execute at a time) */
  ipt_request* requests;
  uint64_t requests_room;
  int64_t *ids, *lengths; /* every text's ids (room + specials apart), and each text's count */
  uint64_t ids_room, lengths_room;
  char* lowered;
  uint64_t lowered_room;
  char* copy; /* every request's TEXT, copied once: the client's buffer (shared memory) may change under us */
  uint64_t copy_room, copied;
  /* batches, requests, texts served here; batches handed to Python */
  uint64_t counters[IPT_COUNTERS];
} ipt_state;

static ipt_state* registry[IPT_MAX_INSTANCES];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static ipt_state* find(void* instance) {
  for (int i = 0; i < IPT_MAX_INSTANCES; ++i) {
    if (registry[i] && registry[i]->instance == instance) return registry[i];
  }
  return NULL;
}

static void release_state(ipt_state* s) {
  if (s == NULL) return;
  ipt_vocab_free(&s->vocab);
  free(s->requests), free(s->ids), free(s->lengths), free(s->lowered), free(s->copy);
  free(s);
}

int ipt_open(void* instance, const ipt_spec* spec) {
  ipt_state* s = calloc(1, sizeof *s);
  if (s == NULL) return 1;
  s->instance = instance;
  int code = ipt_vocab_build(&s->vocab, spec);
  for (int o = 0; o < 2 && code == 0; ++o) {
    if (spec->output_dtypes[o] != DTYPE_INT64 && spec->output_dtypes[o] != DTYPE_INT32) code = 3;
  }
  if (code) return release_state(s), code;
  pthread_mutex_lock(&registry_lock);
  int placed = 0;
  for (int i = 0; i < IPT_MAX_INSTANCES && !placed; ++i) {
    if (registry[i] == NULL) registry[i] = s, placed = 1;
  }
  pthread_mutex_unlock(&registry_lock);
  if (!placed) return release_state(s), 2;
  return 0;
}

void ipt_close(void* instance, uint64_t* counts) {
  pthread_mutex_lock(&registry_lock); /* Triton finalizes an instance only once its executes have returned */
  ipt_state* s = NULL;
  for (int i = 0; i < IPT_MAX_INSTANCES; ++i) {
    if (registry[i] && registry[i]->instance == instance) s = registry[i], registry[i] = NULL;
  }
  pthread_mutex_unlock(&registry_lock);
  if (s) memcpy(counts, s->counters, sizeof s->counters);
  release_state(s);
}

void ipt_counts(void* instance, uint64_t* counts) {
  pthread_mutex_lock(&registry_lock);
  ipt_state* s = find(instance);
  if (s) memcpy(counts, s->counters, sizeof s->counters);
  pthread_mutex_unlock(&registry_lock);
}

/* 1 when *p has room for n items of `size` (grown by doubling). */
static int grow(void** p, uint64_t* room, uint64_t n, size_t size) {
  if (n <= *room) return 1;
  uint64_t want = *room ? *room : 64, bytes = 0;
  while (want < n) {
    if (want > UINT64_MAX / 2) return 0;
    want *= 2;
  }
  if (!ipn_mul(want, size, &bytes) || bytes > SIZE_MAX) return 0;
  void* bigger = realloc(*p, (size_t)bytes);
  if (bigger == NULL) return 0;
  *p = bigger, *room = want;
  return 1;
}

/* The request's TEXT as one host buffer of well-formed BYTES elements, copied once into the state's copy and
 * checked there (every later read is of the copy); 0: not read here. */
static int read_text(ipt_state* s, void* request, ipt_request* q) {
  TRITONBACKEND_Input* input = NULL;
  const char* name = NULL;
  int dtype = 0, memory = 0;
  const int64_t* shape = NULL;
  uint32_t dims = 0, buffers = 0;
  uint64_t size = 0, bytes = 0;
  int64_t device = 0;
  const void* base = NULL;
  if (!ipn_ok(TRITONBACKEND_RequestInput(request, s->vocab.spec.input_name, &input)) ||
      !ipn_ok(TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &dims, &size, &buffers)) ||
      dtype != DTYPE_BYTES || buffers != 1 ||
      !ipn_ok(TRITONBACKEND_InputBuffer(input, 0, &base, &bytes, &memory, &device)) || memory == MEMORY_GPU ||
      bytes != size || size > IPN_MAX_REQUEST_BYTES) {
    return 0;
  }
  uint64_t texts = 0;
  if (!ipn_elements(shape, dims, &texts) || texts == 0 || texts > size / 4) return 0;
  if (!grow((void**)&s->copy, &s->copy_room, s->copied + size, 1)) return 0;
  char* at = s->copy + s->copied;
  memcpy(at, base, size); /* from here on only the copy is read */
  uint64_t left = size;
  for (uint64_t t = 0; t < texts; ++t) { /* each: 4 bytes of length (little-endian), then the text */
    if (left < 4) return 0;
    uint32_t n;
    memcpy(&n, at, 4);
    if (n > left - 4 || n > IPT_MAX_TEXT) return 0;
    at += 4 + n, left -= 4 + (uint64_t)n;
  }
  if (left != 0) return 0;
  q->request = request, q->text = s->copied, q->bytes = size, q->texts = texts;
  s->copied += size;
  return 1;
}

/* Every request read and tokenized into the state's arrays; 0 (nothing answered) when a text is not read here. */
static int tokenize_batch(ipt_state* s, void** requests, uint32_t count, uint64_t* texts) {
  uint64_t width = (uint64_t)ipt_width(&s->vocab);
  if (!grow((void**)&s->requests, &s->requests_room, count, sizeof *s->requests)) return 0;
  *texts = 0;
  s->copied = 0;
  for (uint32_t r = 0; r < count; ++r) {
    ipt_request* q = &s->requests[r];
    memset(q, 0, sizeof *q);
    if (requests[r] == NULL || !read_text(s, requests[r], q)) return 0;
    q->first = *texts;
    *texts += q->texts;
  }
  uint64_t cells = 0;
  if (!ipn_mul(*texts, width, &cells) || !grow((void**)&s->ids, &s->ids_room, cells, sizeof *s->ids) ||
      !grow((void**)&s->lengths, &s->lengths_room, *texts, sizeof *s->lengths)) {
    return 0;
  }
  for (uint32_t r = 0; r < count; ++r) {
    ipt_request* q = &s->requests[r];
    const char* at = s->copy + q->text; /* the copy read_text checked: each length read from it again is the same */
    for (uint64_t t = 0; t < q->texts; ++t) {
      uint32_t n;
      memcpy(&n, at, 4);
      if (n > IPT_MAX_TEXT || !grow((void**)&s->lowered, &s->lowered_room, n ? n : 1, 1)) return 0;
      int64_t got = ipt_encode(&s->vocab, at + 4, n, s->lowered, s->ids + (q->first + t) * width);
      if (got < 0) return 0;
      s->lengths[q->first + t] = got;
      q->width = got > q->width ? got : q->width;
      at += 4 + n;
    }
  }
  return 1;
}

/* One request's ids and mask, [its texts, its longest], into its response, sent; 1 when it went out whole. */
static int answer(ipt_state* s, ipt_request* q) {
  const ipt_spec* p = &s->vocab.spec;
  uint64_t width = (uint64_t)ipt_width(&s->vocab);
  void* response = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, q->request);
  for (int o = 0; o < 2 && err == NULL; ++o) {
    if (!ipn_wanted_output(q->request, p->output_names[o], 2)) continue;
    int64_t shape[2] = {(int64_t)q->texts, q->width};
    int unit = p->output_dtypes[o] == DTYPE_INT64 ? 8 : 4;
    uint64_t bytes = q->texts * (uint64_t)q->width * unit;
    void *output = NULL, *buffer = NULL;
    int memory = 0;
    int64_t device = 0;
    err = TRITONBACKEND_ResponseOutput(response, &output, p->output_names[o], p->output_dtypes[o], shape, 2);
    if (err == NULL) err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory, &device);
    if (err != NULL || bytes == 0) continue;
    char* host = memory == MEMORY_GPU ? malloc(bytes) : buffer;
    if (host == NULL) {
      err = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "out of memory");
      continue;
    }
    for (uint64_t t = 0; t < q->texts; ++t) {
      const int64_t* ids = s->ids + (q->first + t) * width;
      int64_t real = s->lengths[q->first + t];
      for (int64_t k = 0; k < q->width; ++k) {
        int64_t value = k < real ? (o == 0 ? ids[k] : 1) : 0;
        char* to = host + (t * (uint64_t)q->width + (uint64_t)k) * unit;
        if (unit == 8) memcpy(to, &value, 8);
        else {
          int32_t small = (int32_t)value;
          memcpy(to, &small, 4);
        }
      }
    }
    if (memory == MEMORY_GPU) { /* the client's CUDA shared memory: one copy to the device */
      void* context = NULL;
      int copied = ipn_load_driver() && cu.DevicePrimaryCtxRetain(&context, (int)device) == 0 &&
                   cu.CtxSetCurrent(context) == 0 &&
                   cu.MemcpyHtoDAsync((uint64_t)(uintptr_t)buffer, host, bytes, NULL) == 0 &&
                   cu.StreamSynchronize(NULL) == 0;
      free(host);
      if (!copied) err = TRITONSERVER_ErrorNew(ERROR_INTERNAL, "copying an output into device memory failed");
    }
  }
  if (response != NULL) ipn_ok(TRITONBACKEND_ResponseSend(response, COMPLETE_FINAL, err));
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
  return err == NULL && response != NULL;
}

/* Serves the batch natively and returns 1, or returns 0 having answered nothing (Python serves it). */
int ipt_execute(void* instance, void** requests, uint32_t count) {
  pthread_mutex_lock(&registry_lock);
  ipt_state* s = find(instance);
  pthread_mutex_unlock(&registry_lock);
  if (s == NULL) return 0;
  uint64_t started = ipn_now(), texts = 0;
  if (!tokenize_batch(s, requests, count, &texts)) {
    __atomic_add_fetch(&s->counters[3], 1, __ATOMIC_RELAXED);
    return 0;
  }
  uint64_t computed = ipn_now();
  for (uint32_t r = 0; r < count; ++r) s->requests[r].sent = answer(s, &s->requests[r]);
  uint64_t answered = ipn_now();
  for (uint32_t r = 0; r < count; ++r) {
    ipn_report(instance, s->requests[r].request, s->requests[r].sent, started, started, computed, ipn_now(), answered);
    ipn_ok(TRITONBACKEND_RequestRelease(s->requests[r].request, RELEASE_ALL));
  }
  ipn_ok(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, texts, started, started, computed, ipn_now()));
  __atomic_add_fetch(&s->counters[0], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s->counters[1], count, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s->counters[2], texts, __ATOMIC_RELAXED);
  return 1;
}
