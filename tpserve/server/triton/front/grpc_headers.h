/* grpc_headers: a gRPC client's deadline never reaches tritonserver (h2_reading.c, on a gRPC port clients reach
 * directly). The representations of an HPACK header block (RFC 7541) are walked as their bytes pass, and the one
 * name that carries a deadline, grpc-timeout, is renamed grpc-timeous in place: the same number of bytes and
 * octets, so both sides' dynamic tables stay in step, and a later reference to the entry names the renamed
 * header too. Plain names differ in their last byte ('t' to 's'); Huffman-coded ones too ('s' is 't' with its
 * last bit cleared, and both end in the last byte where the padding is the 6 bits RFC 7541 allows). */
#ifndef GRPC_HEADERS_H
#define GRPC_HEADERS_H

#include <stddef.h>
#include <stdint.h>

/* The shim is preloaded into tritonserver: what it shares between its files stays inside it (only the libc calls
 * it wraps are exported), so no name here can stand in for one of tritonserver's libraries. */
#pragma GCC visibility push(hidden)

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

/* The server's HPACK decoding state as a client's whole header blocks change it (RFC 7541 section 4): what a block
 * may refer to and how large a table it may ask for. Entry sizes only, and of a :path entry which call it names;
 * no name or value is kept. */
#define HPACK_ENTRIES 160 /* 4096 / 32 + slack: a table of the server's default size holds at most 128 */
struct hpack_table {
    uint32_t size, max;  /* the entries' sizes together, and the table's size now */
    uint32_t limit;      /* the largest size the server allows (its SETTINGS_HEADER_TABLE_SIZE; 4096) */
    uint32_t first, count;  /* the newest entry's slot in the rings below, and how many there are */
    uint32_t entry_size[HPACK_ENTRIES];
    uint16_t name_length[HPACK_ENTRIES];
    uint8_t path_kind[HPACK_ENTRIES]; /* HPACK_PATH_* below */
};

/* What a block's :path names: none, ModelStreamInfer (the one call gRPC hands tritonserver when its headers come,
 * before any message: the others wait for their request), ModelInfer, or another call. */
enum { HPACK_PATH_NONE = 0, HPACK_PATH_OTHER = 1, HPACK_PATH_STREAM = 2, HPACK_PATH_INFER = 3 };
/* An entry named x-edge-call (call_ids.h: the id the guard gives each call); in hpack_check's *path, the bit that
 * says a block carries a field of that name, as a literal or from the table. */
enum { HPACK_NAME_CALL_ID = 4, HPACK_PATH_MASK = 0x0f, HPACK_OWN_CALL_ID = 0x80 };

void hpack_table_start(struct hpack_table *t);

/* A client's whole header block (its fragments joined): 0 when gRPC's decoder reads it without error, its changes
 * to the table made and what its (last) :path names in *path (when path is not NULL; with HPACK_OWN_CALL_ID set
 * where the block carries an x-edge-call field); -1 when it would end the
 * connection (an index past the tables, a malformed integer or Huffman string, a table size past the limit, a
 * block ending inside a representation, a size update after a field or a third one), the table unchanged. */
int hpack_check(struct hpack_table *t, const uint8_t *block, size_t length, uint8_t *path);

/* Whether the block read so far ends between representations (so it may end there). */
int hpack_walk_between(const struct hpack_walk *w);

#pragma GCC visibility pop

#endif
