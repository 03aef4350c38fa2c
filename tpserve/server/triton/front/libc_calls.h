/* libc_calls: the libc calls the guard wraps (wrappers.c), the real ones, for the front's own use: what the front
 * reads, writes and closes itself never passes through its own wrappers. */
#ifndef LIBC_CALLS_H
#define LIBC_CALLS_H

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#pragma GCC visibility push(hidden)

extern ssize_t (*real_recvmsg)(int, struct msghdr *, int);
extern ssize_t (*real_recv)(int, void *, size_t, int);
extern ssize_t (*real_read)(int, void *, size_t);
extern ssize_t (*real_readv)(int, const struct iovec *, int);
extern ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
extern ssize_t (*real_send)(int, const void *, size_t, int);
extern ssize_t (*real_write)(int, const void *, size_t);
extern ssize_t (*real_writev)(int, const struct iovec *, int);
extern int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
extern int (*real_close)(int);
extern int (*real_shm_open)(const char *, int, mode_t);
extern int (*real_ioctl)(int, unsigned long, ...);

/* Looks them up once (a wrapper can run before any constructor: the shim's own reads the admin key, so each wrapper
 * calls this first). */
void libc_resolve(void);

/* One line on stderr (the server's log), at most 511 bytes. */
void guard_say(const char *format, ...) __attribute__((format(printf, 1, 2)));

#pragma GCC visibility pop

#endif
