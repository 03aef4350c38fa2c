/* h2_gone: see h2_gone.c. */
#ifndef H2_GONE_H
#define H2_GONE_H

#include "h2_reader.h"

/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)


size_t hand_ready(struct h2_reader *r, const struct iovec *iov, size_t parts, size_t room);
void peer_gone(struct h2_reader *r);
ssize_t gone_read(int fd, struct h2_reader *r, const struct iovec *iov, size_t parts, size_t room);
void wake(int fd, struct h2_reader *r);
void cut_connection(int fd, struct h2_reader *r);
int hang_up(ssize_t got, int error, struct h2_reader *r);

#pragma GCC visibility pop

#endif
