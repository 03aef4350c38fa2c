/* The HPACK walk of grpc_headers.h: only representation boundaries and literal names are read, never a table; and
 * the check of whole blocks against the table's sizes. */
#include "grpc_headers.h"

#include <pthread.h>
#include <string.h>

#include "hpack_tables.h"

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

/* ---- whole blocks checked ---- */

#define STATIC_ENTRIES 61
#define INTEGER_MAX 0x7fffffffu

/* The Huffman code as a tree: node 0 the root; child[n][bit] a node, or 0x8000 | symbol at a leaf. */
static uint16_t child[256][2];
static pthread_once_t tree_once = PTHREAD_ONCE_INIT;

static void build_tree(void) {
    uint16_t nodes = 1;
    for (uint16_t symbol = 0; symbol < 257; symbol++) {
        uint16_t at = 0;
        for (int bit = HUFFMAN_BITS[symbol] - 1; bit >= 0; bit--) {
            int b = (HUFFMAN_CODES[symbol] >> bit) & 1;
            if (bit == 0) {
                child[at][b] = (uint16_t)(0x8000 | symbol);
            } else {
                if (child[at][b] == 0) child[at][b] = nodes++;
                at = child[at][b];
            }
        }
    }
}

void hpack_table_start(struct hpack_table *t) {
    memset(t, 0, sizeof *t);
    t->max = t->limit = 4096;
    pthread_once(&tree_once, build_tree);
}

/* Octets a Huffman string decodes to, or -1 where gRPC's decoder fails: the EOS symbol, padding of 8 bits or
 * more, or padding other than ones (RFC 7541 5.2). */
static int64_t huffman_length(const uint8_t *bytes, size_t n) {
    int64_t octets = 0;
    uint16_t at = 0;
    int depth = 0, ones = 1;
    for (size_t i = 0; i < n; i++) {
        for (int bit = 7; bit >= 0; bit--) {
            int b = (bytes[i] >> bit) & 1;
            uint16_t next = child[at][b];
            depth++, ones = ones && b;
            if (next & 0x8000) {
                if ((next & 0x7fff) == 256) return -1;
                octets++, at = 0, depth = 0, ones = 1;
            } else if (next == 0) {
                return -1;
            } else {
                at = next;
            }
        }
    }
    return depth < 8 && ones ? octets : -1;
}

struct reading {
    const uint8_t *at, *end;
};

/* An integer with an n-bit prefix (RFC 7541 5.1), its first byte's other bits in *flags; -1 where malformed. */
static int64_t read_integer(struct reading *in, int bits, uint8_t *flags) {
    if (in->at >= in->end) return -1;
    uint32_t mask = (1u << bits) - 1;
    uint8_t first = *in->at++;
    if (flags) *flags = (uint8_t)(first & ~mask);
    uint64_t value = first & mask;
    if (value < mask) return (int64_t)value;
    for (int shift = 0; in->at < in->end; shift += 7) {
        uint8_t byte = *in->at++;
        if (shift > 28) return -1;
        value += (uint64_t)(byte & 0x7f) << shift;
        if (value > INTEGER_MAX) return -1;
        if (!(byte & 0x80)) return (int64_t)value;
    }
    return -1;
}

/* A string literal read: its bytes as sent, whether Huffman-coded, its decoded length (-1 where malformed). */
struct literal {
    const uint8_t *bytes;
    size_t n;
    int huffman;
    int64_t octets;
};

static struct literal read_string(struct reading *in) {
    struct literal s = {in->at, 0, 0, -1};
    if (in->at >= in->end) return s;
    s.huffman = (*in->at & 0x80) != 0;
    int64_t length = read_integer(in, 7, NULL);
    if (length < 0 || length > in->end - in->at) return s;
    s.bytes = in->at, s.n = (size_t)length;
    in->at += length;
    s.octets = s.huffman ? huffman_length(s.bytes, s.n) : length;
    return s;
}

/* Whether a well-formed literal decodes to text. */
static int literal_is(const struct literal *s, const char *text) {
    size_t want = strlen(text);
    if (s->octets != (int64_t)want) return 0;
    if (!s->huffman) return memcmp(s->bytes, text, want) == 0;
    size_t out = 0;
    uint16_t at = 0;
    for (size_t i = 0; i < s->n; i++) {
        for (int bit = 7; bit >= 0; bit--) {
            uint16_t next = child[at][(s->bytes[i] >> bit) & 1];
            if (!(next & 0x8000)) {
                at = next;
            } else {
                if (out >= want || (uint8_t)text[out++] != (next & 0xff)) return 0;
                at = 0;
            }
        }
    }
    return out == want;
}

#define STREAM_PATH "/inference.GRPCInferenceService/ModelStreamInfer"
#define INFER_PATH "/inference.GRPCInferenceService/ModelInfer"

/* What a :path value names: the one call gRPC hands the server before its first message, an inference, another. */
static uint8_t path_kind(const struct literal *value) {
    if (literal_is(value, STREAM_PATH)) return HPACK_PATH_STREAM;
    return literal_is(value, INFER_PATH) ? HPACK_PATH_INFER : HPACK_PATH_OTHER;
}

static void evict_to(struct hpack_table *t, uint32_t room) {
    while (t->count > 0 && t->size > room) {
        uint32_t oldest = (t->first + t->count - 1) % HPACK_ENTRIES;
        t->size -= t->entry_size[oldest];
        t->count--;
    }
}

/* The entry a representation's index names: its name's length, or -1 past both tables; *kind what its :path
 * names (HPACK_PATH_NONE where it is not a :path). */
static int64_t name_of(const struct hpack_table *t, int64_t index, uint8_t *kind) {
    if (index < 1 || index > STATIC_ENTRIES + (int64_t)t->count) return -1;
    if (index <= STATIC_ENTRIES) {
        *kind = index == 4 || index == 5 ? HPACK_PATH_OTHER : HPACK_PATH_NONE; /* ":path" "/", "/index.html" */
        return STATIC_NAME_LENGTH[index];
    }
    uint32_t slot = (t->first + (uint32_t)(index - STATIC_ENTRIES - 1)) % HPACK_ENTRIES;
    *kind = t->path_kind[slot];
    return t->name_length[slot];
}

static void add_entry(struct hpack_table *t, int64_t name, int64_t value, uint8_t kind) {
    uint64_t size = (uint64_t)name + (uint64_t)value + 32;
    if (size > t->max) { /* larger than the table: it empties it (RFC 7541 4.4) */
        evict_to(t, 0);
        return;
    }
    evict_to(t, t->max - (uint32_t)size);
    if (t->count == HPACK_ENTRIES) evict_to(t, t->size - 1); /* cannot happen within 4096: kept bounded anyway */
    t->first = (t->first + HPACK_ENTRIES - 1) % HPACK_ENTRIES;
    t->entry_size[t->first] = (uint32_t)size;
    t->name_length[t->first] = (uint16_t)(name > 0xffff ? 0xffff : name);
    t->path_kind[t->first] = kind;
    t->size += (uint32_t)size;
    t->count++;
}

static int representation_checked(struct hpack_table *t, struct reading *in, uint8_t *path, uint8_t *own) {
    uint8_t first = *in->at, flags, kind = HPACK_PATH_NONE;
    if (first & 0x80) { /* indexed field */
        if (name_of(t, read_integer(in, 7, NULL), &kind) < 0) return -1;
        if (kind == HPACK_NAME_CALL_ID) *own = 1;
        else if (kind != HPACK_PATH_NONE) *path = kind;
        return 0;
    }
    if ((first & 0xe0) == 0x20) { /* size update */
        int64_t size = read_integer(in, 5, NULL);
        if (size < 0 || size > t->limit) return -1;
        t->max = (uint32_t)size;
        evict_to(t, t->max);
        return 0;
    }
    int incremental = (first & 0xc0) == 0x40;
    int64_t index = read_integer(in, incremental ? 6 : 4, &flags), name = -1;
    if (index == 0) {
        struct literal literal_name = read_string(in);
        name = literal_name.octets;
        kind = name >= 0 && literal_is(&literal_name, ":path") ? HPACK_PATH_OTHER : HPACK_PATH_NONE;
        if (name >= 0 && literal_is(&literal_name, "x-edge-call")) kind = HPACK_NAME_CALL_ID;
    } else if (index > 0) {
        name = name_of(t, index, &kind);
    }
    struct literal value = name < 0 ? (struct literal){0, 0, 0, -1} : read_string(in);
    if (index < 0 || value.octets < 0) return -1;
    if (kind == HPACK_NAME_CALL_ID) *own = 1;
    else if (kind != HPACK_PATH_NONE) *path = kind = path_kind(&value);
    if (incremental) add_entry(t, name, value.octets, kind);
    return 0;
}

int hpack_check(struct hpack_table *t, const uint8_t *block, size_t length, uint8_t *path) {
    struct hpack_table trial = *t;
    struct reading in = {block, block + length};
    uint8_t named = HPACK_PATH_NONE, own = 0;
    int fields = 0, updates = 0;
    while (in.at < in.end) {
        int update = (*in.at & 0xe0) == 0x20; /* gRPC takes at most two size updates, before the block's first field */
        if (update && (fields > 0 || ++updates > 2)) return -1;
        if (representation_checked(&trial, &in, &named, &own) < 0) return -1;
        fields += !update;
    }
    *t = trial;
    if (path != NULL) *path = named | (own ? HPACK_OWN_CALL_ID : 0);
    return 0;
}
