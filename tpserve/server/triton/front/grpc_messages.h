/* grpc_messages: the request messages of a ModelStreamInfer stream read as tritonserver's protobuf will read them,
 * as their bytes pass (h2_frame_checks.c). gRPC ends a stream whose next message it cannot decode, and so cancels the
 * stream's requests still running, which crashes tritonserver 2.51; a message that would fail is never let complete.
 *
 * The check is stricter than protobuf where the two could differ, never laxer: every message C++ protobuf (or upb)
 * refuses is refused here (tests/unit/test_grpc_messages.py holds it to python protobuf on generated and mutated
 * messages, and to service_pb2's descriptors for the schema). Refused: a compressed message (its bytes cannot be read
 * before gRPC inflates them) or one over 2^31-1 bytes; a tag of field 0, of wire type 6 or 7, or an end-group that
 * ends no group; a varint of more than 10 bytes or past 64 bits (a tag or a length past 32); a length past its
 * message, or a fixed field, a varint or a group cut by its message's end; a string field (names, ids, map keys,
 * string parameters) that is not UTF-8; a packed fixed field whose length is not a multiple of its element; more
 * than MESSAGE_DEPTH nested messages and groups. Unknown fields, and known ones of another wire type, are read as
 * protobuf reads them: skipped. */
#ifndef GRPC_MESSAGES_H
#define GRPC_MESSAGES_H

#include <stddef.h>
#include <stdint.h>

/* The shim is preloaded into tritonserver: what it shares between its files stays inside it (only the libc calls
 * it wraps are exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

#define MESSAGE_DEPTH 64 /* protobuf's own limit is 100 */

struct pb_level {
    uint8_t type, kind;
    uint32_t group; /* a group's field number (0: a length-delimited level) */
    uint64_t end;   /* where a length-delimited level ends (body offset) */
};

struct message_check {
    uint8_t prefix[5];
    uint32_t prefix_at;
    uint64_t length, at; /* the body's length (from the prefix) and its bytes read */
    uint8_t bad;         /* a message refused: everything after is too */
    uint8_t state, wire, bytes, utf8_need;
    uint8_t utf8_low, utf8_high; /* the range the next byte of a UTF-8 sequence must be in */
    uint32_t field, depth;
    uint64_t value, token_end; /* a varint being read; where a string, bytes or fixed field ends */
    struct pb_level stack[MESSAGE_DEPTH + 1];
    uint64_t messages; /* whole messages read */
};

void message_check_start(struct message_check *c);

/* n more bytes of the stream's DATA (messages back to back): 0, or -1 from the first byte of a message that would
 * fail on (and for every call after). */
int message_check_feed(struct message_check *c, const uint8_t *bytes, size_t n);

/* For tests: what a length-delimited field of a message type is read as (kind << 8 | sub-type; 0: skipped). */
int message_check_rule(int type, int field);

#pragma GCC visibility pop

#endif
