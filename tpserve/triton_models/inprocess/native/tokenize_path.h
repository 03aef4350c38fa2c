/* What tokenize_path.c gives the backend's shim and Python (ctypes): the tokenize step (BERT-style tokenizers,
 * ASCII texts). */
#ifndef TPSERVE_TOKENIZE_PATH_H
#define TPSERVE_TOKENIZE_PATH_H

#include <stdint.h>

#include "bert_tokenize.h"

int ipt_open(void* instance, const ipt_spec* spec);
void ipt_close(void* instance, uint64_t* counts);
void ipt_counts(void* instance, uint64_t* counts);
/* Serves the batch natively and returns 1, or returns 0 having answered nothing (Python serves it). */
int ipt_execute(void* instance, void** requests, uint32_t count);

#endif
