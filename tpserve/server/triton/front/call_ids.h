/* call_ids: the cancelled-calls table (server/edge/cancel_table.py) kept by the guard where clients reach
 * tritonserver's ports directly (`make serve`'s default front), as Envoy's module keeps it behind Envoy
 * (server/edge/cancel_notice.c). Every inference call gets an id, x-edge-call (16 hex digits), put into the request
 * as tritonserver reads it (http_front.c: a header line; h2_own_frames.c: a CONTINUATION frame ending the call's
 * header block); tritonserver passes it to the model as a request parameter (--http-header-forward-pattern,
 * --grpc-header-forward-pattern). When the client goes before its call is answered (it cancelled it, hung up or
 * reset the connection), the id goes into the table, slot id % CALL_SLOTS, and a Python-backend model answers the
 * call unrun (triton_models/python_backend/cancelled_calls.py). Without a table (the launcher names none), no id is
 * given and nothing changes. */
#ifndef CALL_IDS_H
#define CALL_IDS_H

#include <stdint.h>

/* The shim is preloaded into tritonserver: what it shares between its files stays inside it (only the libc calls
 * it wraps are exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

#define CALL_ID_NAME "x-edge-call"
#define CALL_ID_HEX 16
#define CALL_SLOTS (1u << 18) /* as cancelled_calls.SLOTS and cancel_notice.c's CANCEL_SLOTS */

/* Maps the table TRITON_CANCELLED_CALLS names (a 0600 file of this user, CALL_SLOTS ids of 8 bytes); the variable is
 * left set, since the models' stubs read it too. A table that is not one is said and not used. */
void call_ids_start(void);

/* A new call's id (never 0), or 0 where there is no table. Unique within this server's run: a random start, then
 * one more each call, so that the ids of calls made close together never share a slot. */
uint64_t call_id_next(void);

/* The id's call is not waited for: the model answers it unrun (0: nothing). */
void call_id_cancelled(uint64_t id);

/* The id as 16 lowercase hex digits (no terminator). */
void call_id_hex(uint64_t id, char out[CALL_ID_HEX]);

#pragma GCC visibility pop

#endif
