/* h2_frame_checks: see h2_frame_checks.c. */
#ifndef H2_FRAME_CHECKS_H
#define H2_FRAME_CHECKS_H

#include "h2_reader.h"

/* The shim is preloaded into tritonserver: what its files share stays inside it (only the libc calls it wraps are
 * exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

#define STREAMS_PER_CONNECTION 1024 /* more: cut, as Envoy's and nghttp2's per-connection stream limits do */
#define OPEN_PER_CONNECTION 128     /* of them, whose message is still to come (each holds gRPC's memory and no call) */
#define SETTINGS_CAP 100            /* a client's SETTINGS frames: each makes the server queue an ACK (more: cut) */
#define BLOCK_BROKEN SIZE_MAX         /* the frames after a HEADERS are not its CONTINUATIONs: they are cut on their own */
#define BLOCK_TOO_LONG (SIZE_MAX - 1) /* past BLOCK_CAP */

int breaks_a_call(const struct h2_reader *r, uint8_t type, uint8_t flags, uint32_t length, uint32_t stream,
                         const struct stream_state *known);
void canonical_flags(struct h2_reader *r, const struct received *in, size_t at);
uint32_t held_payload(uint8_t type, uint8_t flags, uint32_t length);
int lead_breaks(uint8_t type, uint8_t flags, uint32_t length, uint32_t stream, const struct received *in,
                       size_t p);
int window_update_breaks(struct h2_reader *r, uint32_t stream, const struct received *in, size_t p);
int reset_breaks(struct h2_reader *r, struct stream_state *known);
int settings_break(struct h2_reader *r, const struct received *in, size_t p, uint32_t length);
size_t block_extent(const struct received *in, size_t at, size_t *need);
size_t last_frame(const struct received *in, size_t at, size_t extent);
int block_breaks(struct h2_reader *r, const struct received *in, size_t at, size_t extent);
int ping_answered(struct h2_reader *r, const struct received *in, size_t at);
int streaming_data(const struct h2_reader *r, const uint8_t *head);
int first_call_data(const struct h2_reader *r, const uint8_t *head);
uint32_t message_lead(const uint8_t *head);
int stream_data_breaks(struct stream_state *known, const struct received *in, size_t at);

#pragma GCC visibility pop

#endif
