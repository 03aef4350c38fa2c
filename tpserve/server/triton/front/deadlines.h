/* deadlines: see deadlines.c. */
#ifndef FRONT_DEADLINES_H
#define FRONT_DEADLINES_H

#include <stdint.h>

#pragma GCC visibility push(hidden)

enum deadline_kind { DEADLINE_HTTP, DEADLINE_GRPC };

/* Starts the one thread that shuts down the public connections past their deadline, once, whichever front asks
 * first (-1: it cannot start). */
int deadlines_start(void);

/* The connection must have made its progress by `at` (CLOCK_MONOTONIC ns); 0: nothing is due. */
void deadline_set(int fd, int64_t at, enum deadline_kind kind);

/* A client's connection has gone: the same thread gives the free memory of every arena back to the system over the
 * next seconds (malloc_trim, at most once a second), once what tritonserver's own threads held for it is freed too
 * (glibc keeps what threads free in their arenas: 512 connections' 4 MiB frames stayed in RSS until trimmed). */
void deadlines_trim_soon(void);

#pragma GCC visibility pop

#endif
