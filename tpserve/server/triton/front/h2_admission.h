/* h2_admission: see h2_admission.c. */
#ifndef H2_ADMISSION_H
#define H2_ADMISSION_H

#include "bounds.h"
#include "h2_reader.h"

/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

enum { NOT_REFUSED = 0, REFUSED = 1, REFUSAL_CUTS = 2 };
#define RECENT_NS 2000000000LL /* a connection cancelled "lately": within 2 s */
/* the calls one connection may leave running for nobody: past them, while it cancels, its new calls are refused (a
 * model's queue is often smaller than the server's bound, and one cancelling client would keep it full) */
#define ORPHANS_PER_CONNECTION 4
#define TOO_LONG_WHY "the message is over the edge's limit (--max-request-mb)"
/* one connection's share of the waiting bound while other connections' calls wait too (Envoy keeps per-connection
 * limits likewise): one client's connection never holds every place */
#define SHARE_OF(bound) ((bound) / 2 > 0 ? (bound) / 2 : 1)
#define SHARE_WHY "this connection runs its share of the calls the server lets wait (--max-waiting); retry after 1 s"
#define OWN_ID_WHY "x-edge-call is the server's own header (each call's id): leave it out"
#define STREAMING_VARIABLE "TRITON_GUARD_STREAMING" /* 1: ModelStreamInfer served on the public port */
#define STREAMING_WHY \
    "ModelStreamInfer is not served here: tritonserver 2.51 crashes under concurrent streams; unary ModelInfer is served"
/* a refusal's grpc-message is one HPACK string of a one-byte length: under 127 bytes */
_Static_assert(sizeof STREAMING_WHY <= 127 && sizeof WAITING_WHY <= 127 && sizeof BACKLOG_WHY <= 127, "too long");
_Static_assert(sizeof SHARE_WHY <= 127 && sizeof OWN_ID_WHY <= 127 && sizeof TOO_LONG_WHY <= 127, "too long");

/* ModelStreamInfer on the public port (TRITON_GUARD_STREAMING=1; off: each stream refused, docs/security.md) */
extern int streaming_served;

int refused_call(struct h2_reader *r, const struct received *in, size_t at, struct stream_state *known,
                        uint32_t stream, uint32_t length);

#pragma GCC visibility pop

#endif
