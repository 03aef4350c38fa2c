/* The ModelStreamInfer message check (server/triton/front/grpc_messages.c) for tests through ctypes: a stream of gRPC
 * messages fed in pieces of a given size. */
#include <stddef.h>
#include <stdint.h>

#include "../../tpserve/server/triton/front/grpc_messages.h"

/* Whole messages read, or -1 where one could not be. */
long check_stream(const uint8_t *bytes, size_t n, size_t piece) {
    struct message_check c;
    message_check_start(&c);
    for (size_t at = 0; at < n; at += piece) {
        size_t take = n - at < piece ? n - at : piece;
        if (message_check_feed(&c, bytes + at, take) < 0) return -1;
    }
    return (long)c.messages;
}

int rule(int type, int field) { return message_check_rule(type, field); }
