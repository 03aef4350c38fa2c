/* h2_reading: see h2_reading.c. */
#ifndef H2_READING_H
#define H2_READING_H

#include "h2_reader.h"

/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

/* The socket's own read into buffers (the real recvmsg or readv, with what the caller asked). */
typedef ssize_t (*reader_fn)(int fd, struct iovec *iov, size_t parts, void *context);

ssize_t guarded_read(int fd, const struct iovec *iov, size_t parts, reader_fn read_more, void *context);

#pragma GCC visibility pop

#endif
