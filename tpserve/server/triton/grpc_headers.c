/* The HPACK walk of grpc_headers.h: only representation boundaries and literal names are read, never a table. */
#include "grpc_headers.h"

enum { REPRESENTATION, INTEGER, STRING_LENGTH, STRING };
enum { TO_REPRESENTATION, TO_VALUE, TO_STRING };

#define LENGTH_CAP 0x7fffffffu

static const uint8_t PLAIN[12] = {'g', 'r', 'p', 'c', '-', 't', 'i', 'm', 'e', 'o', 'u', 't'};
/* grpc-timeout Huffman-coded (RFC 7541 Appendix B): 66 bits, then 6 bits of padding (ones) in its ninth byte */
static const uint8_t CODED[9] = {0x9a, 0xca, 0xc8, 0xb2, 0x4d, 0x49, 0x4f, 0x6a, 0x7f};
#define CODED_RENAMED 0x3f /* the ninth byte of grpc-timeous */

void hpack_walk_start(struct hpack_walk *w) {
    uint32_t renamed = w->renamed;
    *w = (struct hpack_walk){0};
    w->renamed = renamed;
}

/* A string of this many bytes begins (its length read): its bytes next, or what follows an empty one. */
static void string_begins(struct hpack_walk *w, uint32_t length) {
    w->value = length, w->at = 0;
    w->matching = w->is_name && (w->huffman ? length >= sizeof CODED : length == sizeof PLAIN);
    if (length > 0) {
        w->state = STRING;
    } else if (w->is_name) {
        w->is_name = 0, w->state = STRING_LENGTH; /* its value */
    } else {
        w->state = REPRESENTATION;
    }
}

/* An integer (after its prefix, or whole when it fits the prefix) is read: where it leads. */
static void integer_read(struct hpack_walk *w) {
    if (w->after == TO_STRING) {
        string_begins(w, w->value);
    } else if (w->after == TO_VALUE) {
        w->is_name = 0, w->state = STRING_LENGTH;
    } else {
        w->state = REPRESENTATION;
    }
}

/* An integer with an n-bit prefix starts in byte; after: where it leads once read. */
static void integer_starts(struct hpack_walk *w, uint8_t byte, int bits, uint8_t after) {
    uint32_t mask = (1u << bits) - 1;
    w->value = byte & mask, w->shift = 0, w->after = after;
    if (w->value == mask) w->state = INTEGER;
    else integer_read(w);
}

static void representation(struct hpack_walk *w, uint8_t byte) {
    if (byte & 0x80) { /* indexed field */
        integer_starts(w, byte, 7, TO_REPRESENTATION);
    } else if ((byte & 0xe0) == 0x20) { /* dynamic table size update */
        integer_starts(w, byte, 5, TO_REPRESENTATION);
    } else {
        int bits = (byte & 0xc0) == 0x40 ? 6 : 4; /* with incremental indexing : without, or never indexed */
        if ((byte & ((1u << bits) - 1)) == 0) { /* a literal name */
            w->is_name = 1, w->state = STRING_LENGTH;
        } else {
            integer_starts(w, byte, bits, TO_VALUE);
        }
    }
}

static void integer_byte(struct hpack_walk *w, uint8_t byte) {
    if (w->shift < 28) {
        uint64_t grown = (uint64_t)w->value + ((uint64_t)(byte & 0x7f) << w->shift);
        w->value = grown > LENGTH_CAP ? LENGTH_CAP : (uint32_t)grown;
        w->shift += 7;
    } else {
        w->value = LENGTH_CAP; /* past what any reader takes: the block is malformed, and is read on as such */
    }
    if (!(byte & 0x80)) integer_read(w);
}

/* A byte of a name being compared with grpc-timeout: what to hand out (renamed where it is the last byte). */
static uint8_t name_byte(struct hpack_walk *w, uint8_t byte) {
    uint32_t at = w->at;
    int last = at + 1 == w->value;
    if (w->huffman) {
        uint8_t expected = at < sizeof CODED ? CODED[at] : 0xff; /* padding beyond: ones */
        w->matching = w->matching && byte == expected;
        if (w->matching && last) {
            w->renamed++;
            /* nine bytes: grpc-timeous; longer padding (not RFC 7541's): a zero bit, so the name is not read so */
            return w->value == sizeof CODED ? CODED_RENAMED : (uint8_t)(byte & 0x7f);
        }
        return byte;
    }
    w->matching = w->matching && byte == PLAIN[at];
    if (w->matching && last) {
        w->renamed++;
        return 's';
    }
    return byte;
}

static uint8_t string_byte(struct hpack_walk *w, uint8_t byte) {
    uint8_t out = w->is_name && w->matching ? name_byte(w, byte) : byte;
    if (++w->at == w->value) {
        if (w->is_name) {
            w->is_name = 0, w->state = STRING_LENGTH;
        } else {
            w->state = REPRESENTATION;
        }
    }
    return out;
}

uint8_t hpack_walk_byte(struct hpack_walk *w, uint8_t byte) {
    switch (w->state) {
    case REPRESENTATION:
        representation(w, byte);
        return byte;
    case INTEGER:
        integer_byte(w, byte);
        return byte;
    case STRING_LENGTH:
        w->huffman = (byte & 0x80) != 0;
        integer_starts(w, byte, 7, TO_STRING);
        return byte;
    default:
        return string_byte(w, byte);
    }
}

int hpack_walk_between(const struct hpack_walk *w) {
    return w->state == REPRESENTATION;
}
