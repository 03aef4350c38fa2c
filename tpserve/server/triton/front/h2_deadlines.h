/* h2_deadlines: see h2_deadlines.c. */
#ifndef H2_DEADLINES_H
#define H2_DEADLINES_H

#include "h2_reader.h"

#pragma GCC visibility push(hidden)

/* A stream's message is due by `due` (CLOCK_MONOTONIC ns; 0: no deadline), under r->lock. */
void stream_due(struct h2_reader *r, struct stream_state *s, int64_t due);

/* The stream began its message: the rest of it is due by a body's deadline from now (its length from the message's
 * prefix, 0 where unknown). */
void message_begun(struct h2_reader *r, struct stream_state *s, uint32_t length);

/* The unit the guard holds for a connection changed (r->held_count, r->hold_room): due from when it was first held. */
void held_changed(struct h2_reader *r);

/* The connection is forgotten: nothing of it is due. */
void deadlines_forget(int fd);

#pragma GCC visibility pop

#endif
