/* h2_writing: see h2_writing.c. */
#ifndef H2_WRITING_H
#define H2_WRITING_H

#include "h2_reader.h"

/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)


void settings_acked(struct h2_reader *r);
ssize_t guarded_write(int fd, const struct iovec *iov, size_t parts, ssize_t sent);
int fd_gone(int fd);
void before_writing(int fd, const struct iovec *iov, size_t parts);
struct h2_reader *writing(int fd);
ssize_t written(int fd, struct h2_reader *r, ssize_t sent);
int held_back(int fd, struct h2_reader *r);
void reply_now(int fd, struct h2_reader *r);

#pragma GCC visibility pop

#endif
