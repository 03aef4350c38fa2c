/* grpc_headers: a gRPC client's deadline never reaches tritonserver (triton_guard.c, on a gRPC port clients reach
 * directly). The representations of an HPACK header block (RFC 7541) are walked as their bytes pass, and the one
 * name that carries a deadline, grpc-timeout, is renamed grpc-timeous in place: the same number of bytes and
 * octets, so both sides' dynamic tables stay in step, and a later reference to the entry names the renamed
 * header too. Plain names differ in their last byte ('t' to 's'); Huffman-coded ones too ('s' is 't' with its
 * last bit cleared, and both end in the last byte where the padding is the 6 bits RFC 7541 allows). */
#ifndef GRPC_HEADERS_H
#define GRPC_HEADERS_H

#include <stdint.h>

struct hpack_walk {
    uint8_t state;    /* where in a representation the next byte is (grpc_headers.c) */
    uint8_t after;    /* the state an integer's continuation bytes lead to */
    uint8_t huffman;  /* the string being read is Huffman-coded */
    uint8_t is_name;  /* the string being read is a literal name */
    uint8_t matching; /* every byte of this name so far is grpc-timeout's (or its Huffman code's and padding) */
    uint8_t shift;    /* of the integer being read */
    uint32_t value;   /* the integer being read (a string's length) */
    uint32_t at;      /* bytes of the string read so far */
    uint32_t renamed; /* names renamed so far */
};

/* At the start of a header block (a HEADERS frame's fragment; CONTINUATION fragments carry on the same walk). */
void hpack_walk_start(struct hpack_walk *w);

/* One byte of a header block: the byte to hand out in its place (itself unless it ends a grpc-timeout name). */
uint8_t hpack_walk_byte(struct hpack_walk *w, uint8_t byte);

/* Whether the block read so far ends between representations (so it may end there). */
int hpack_walk_between(const struct hpack_walk *w);

#endif
