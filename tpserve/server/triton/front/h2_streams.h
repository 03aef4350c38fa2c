/* h2_streams: see h2_streams.c. */
#ifndef H2_STREAMS_H
#define H2_STREAMS_H

#include "h2_reader.h"

/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

/* The peer's streams that are orphans the server still runs: change more (or fewer). */
void count_orphans(struct h2_reader *r, int64_t change);

struct stream_state *table_find(const struct h2_reader *r, uint32_t stream);
void set_state(struct h2_reader *r, struct stream_state *s, uint32_t state);
void table_put(struct h2_reader *r, uint32_t stream, uint32_t state);
void table_drop(struct h2_reader *r, struct stream_state *gone);
void server_ended(struct h2_reader *r, uint32_t stream);
void server_answered(struct h2_reader *r, uint32_t stream);
void h2_forget(int fd);
void h2_watch(int fd, int public);
int runs_calls(const struct h2_reader *r);
int h2_watched(int fd);

/* Room for one more public connection: 0 (under the cap, or the one idle the longest was closed for it), or -1
 * (every connection has a call running: the new one is refused). */
int h2_room(void);

#pragma GCC visibility pop

#endif
