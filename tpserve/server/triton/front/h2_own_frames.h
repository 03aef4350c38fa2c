/* h2_own_frames: see h2_own_frames.c. */
#ifndef H2_OWN_FRAMES_H
#define H2_OWN_FRAMES_H

#include "h2_reader.h"

/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

extern unsigned long refused_calls; /* the new calls refused so far (h2_admission.c) */


int reply_room(struct h2_reader *r, size_t n);
void queue_refusal(struct h2_reader *r, uint32_t stream, const char *why, const char *code, uint32_t unread);
void synth_frame(struct h2_reader *r, uint8_t type, uint8_t flags, uint32_t stream, uint32_t increment);
void open_windows(struct h2_reader *r);
void id_frame(uint8_t *at, uint32_t stream, uint64_t id);

#pragma GCC visibility pop

#endif
