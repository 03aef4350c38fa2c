/* What batch_calls.c gives the backend's shim and Python (ctypes): Python's per-batch calls: a batch's input
 * shapes, its inputs gathered, its answers and release. */
#ifndef TPSERVE_BATCH_CALLS_H
#define TPSERVE_BATCH_CALLS_H

#include <stdint.h>


/* Every request's inputs: datatype and [rows, width] (shapes[2 * (r * n + i)]). A request whose inputs are not
 * two-dimensional host tensors of their stated size is READ_BY_PYTHON: Python reads it the slow way, which names
 * what is wrong (or copies device memory). */
void ipb_input_shapes(void** requests, uint32_t count, const char** names, uint32_t n, int32_t* dtypes,
                      int64_t* shapes, uint8_t* status, const int64_t* element_bytes);
/* Each READ_OK request's rows of every input into dest[i], from row first_row[r] on, rows of `widest`
 * elements (shapes as ipb_input_shapes gave them). */
void ipb_gather(void** requests, uint32_t count, const char** names, uint32_t n, const uint8_t* status,
                const int64_t* shapes, const int64_t* first_row, char** dest, int64_t widest,
                const int64_t* element_bytes_per_input);
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
                void** responses, uint64_t* addresses, int64_t* devices, uint64_t* spent);
/* Reports each answered request's statistics (ok: status SENT; times: exec start, compute start, compute end;
 * the exec end is when it was sent) and releases it. Adds the ns to spent[2..3]: statistics, release. */
void ipb_release(void* instance, void** requests, uint32_t count, const uint8_t* status, const uint64_t* times,
                 const uint64_t* sent_at, uint64_t* spent);

#endif
