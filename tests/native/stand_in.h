/* A stand-in for what the in-process backend's native paths call: Triton's backend API (requests whose inputs
 * are buffers this program owns) and the CUDA driver (device memory is host memory here). The fuzzer builds
 * requests, hands them to the native paths as Triton would, and sees what they answered and staged. */
#ifndef STAND_IN_H
#define STAND_IN_H

#include <stdint.h>

enum { SI_MAX_INPUTS = 4, SI_MAX_BUFFERS = 4, SI_MAX_DIMS = 8 };

typedef struct {
  char name[64];
  int dtype;
  int64_t shape[SI_MAX_DIMS];
  uint32_t dims;
  uint64_t size;                      /* the byte size Triton states */
  uint32_t buffers;
  char* data[SI_MAX_BUFFERS];         /* the client's bytes (malloc'd to their exact size) */
  uint64_t bytes[SI_MAX_BUFFERS];
} si_input;

typedef struct si_request {
  si_input inputs[SI_MAX_INPUTS];
  uint32_t count;
  int answered, released, refused;   /* responses sent (refused: with an error) and releases */
  /* a writer of the client's shared memory: run once another request's buffer is read (after this one's checks) */
  void (*writer)(struct si_request*);
  int written;
} si_request;

/* Every request of the batch that the path is reading now (the writer runs once a later one is read). */
extern si_request** si_batch;
extern uint32_t si_batch_count;
/* Values staged into device memory for input 0 of the sequence path, checked against [si_low, si_high). */
extern int64_t si_low, si_high;
extern uint64_t si_out_of_range;
extern int si_check_staged;

void si_install_driver(void);
/* Device memory [base, base + size) whose int64 values si_check_staged holds to [si_low, si_high). */
void si_watch_staged(uint64_t base, uint64_t size);
void si_free_request(si_request* r);

#endif
