/*
 * http_checks: the HTTP request checks (see http_checks.h), run before a request can reach tritonserver 2.51.
 *
 * Why: 2.51 sizes buffers from a request's declared shape before it compares the shape with the data or the model
 * (a 100-byte request declaring [1,1,8,2147483648] made it allocate 64 GiB and die), its JSON parser recurses
 * without a limit (200,000 '[' crashed it) and its HTTP parse is quadratic in the number of parameters. So every
 * request is held to three rules (docs/security.md, "The edge: what it lets through"):
 *
 * 1. Only the paths ROUTES knows reach Triton (health, metadata, config, statistics, inference, the admin APIs);
 *    everything else is refused (404/405). generate and generate_stream are not served.
 * 2. Every JSON body is read strictly, so that the reading here is the reading Triton makes (rapidjson): RFC 8259
 *    grammar, no duplicate keys, no escape sequences in keys, escapes in string values decoded exactly (no lone
 *    surrogates, no control characters), numbers read here (shapes, sizes) written as plain whole numbers,
 *    NaN/Infinity only inside tensor data, nesting, keys per object and items per array bounded.
 * 3. An inference request must be one Triton can serve without harm: every input declared by the model (name,
 *    datatype, rank, fixed dims, batch <= max_batch_size) where the rules know the model, a shape whose tensor fits
 *    max_tensor_bytes, and data of exactly the size the shape says (JSON data counted element by element; binary
 *    data exactly binary_data_size bytes, all within the body). A model load may not carry files ("file:"
 *    parameters: code) and its config override may not point outside the model's folder.
 *
 * Content-Encoding other than identity is refused with 415 (Triton would inflate the body after these checks). The
 * front that calls these checks caps the body (413) and the headers (431) before they run.
 *
 * A body is read once into a small tree: objects and arrays outside tensor data become nodes, strings are decoded
 * into one arena no larger than the body, tensor data ("data": [...]) is checked and counted, never built. Every
 * size is bounded: nesting (max_depth, so recursion too), keys per object, items per array, nodes per body.
 */
#define _GNU_SOURCE
#include "http_checks.h"
#include "call_ids.h" /* CALL_ID_NAME: each call's id, which the front adds as a header */

#pragma GCC diagnostic ignored "-Wformat-truncation" /* a refusal's message is capped on purpose */

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum kind { J_NULL, J_TRUE, J_FALSE, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT };
enum string_mode { KEY, VALUE, DATA };

struct node {
    uint8_t kind;
    const char *key; /* an object member's key (decoded) */
    size_t key_len;
    const char *text; /* a number's text, a string's decoded bytes */
    size_t len;
    int32_t first, last, next; /* children in order; -1: none */
    uint32_t count;
    int64_t data; /* an object's tensor data ("data": [...]): its elements; -1: none */
    uint8_t data_kinds; /* and what they are (DATA_*) */
};

/* What tensor data holds besides numbers: tritonserver reads a numeric tensor's elements as numbers (NaN and
 * Infinity unquoted), and answered a string, a null or a boolean among them 500 ("attempt to access JSON non-number
 * as double"): refused with 400 and why before it reads them. */
enum { DATA_STRING = 1, DATA_BOOLEAN = 2, DATA_NULL = 4 };

struct limits {
    int max_depth, max_keys, max_items;
    uint32_t max_nodes;
    int escaped_keys; /* the rules file: keys may carry escapes (a request's may not) */
};

struct parser {
    const char *text;
    size_t len;
    struct node *nodes;
    uint32_t count, room;
    char *arena; /* decoded strings: never more bytes than the text */
    size_t used;
    struct limits lim;
    char why[CHECK_WHY];
};

#define NO_END ((size_t)-1)

static size_t fail(struct parser *p, size_t pos, const char *format, ...) {
    char what[CHECK_WHY];
    va_list args;
    va_start(args, format);
    vsnprintf(what, sizeof what, format, args);
    va_end(args);
    snprintf(p->why, sizeof p->why, "%s at byte %zu", what, pos + 1);
    return NO_END;
}

static size_t skip_space(const struct parser *p, size_t pos) {
    while (pos < p->len) {
        char c = p->text[pos];
        if (c != ' ' && c != '\t' && c != '\r' && c != '\n') break;
        pos++;
    }
    return pos;
}

static int32_t new_node(struct parser *p, uint8_t kind) {
    if (p->count >= p->lim.max_nodes) return -1;
    if (p->count == p->room) {
        uint32_t room = p->room ? p->room * 2 : 64;
        if (room > p->lim.max_nodes) room = p->lim.max_nodes;
        struct node *grown = realloc(p->nodes, (size_t)room * sizeof *grown);
        if (grown == NULL) return -1;
        p->nodes = grown;
        p->room = room;
    }
    struct node *n = &p->nodes[p->count];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->first = n->last = n->next = -1;
    n->data = -1;
    return (int32_t)p->count++;
}

static void add_child(struct parser *p, int32_t parent, int32_t child) {
    struct node *n = &p->nodes[parent];
    if (n->last < 0) n->first = child;
    else p->nodes[n->last].next = child;
    n->last = child;
    n->count++;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static long hex4(const struct parser *p, size_t pos) {
    if (pos + 4 > p->len) return -1;
    long code = 0;
    for (size_t i = 0; i < 4; i++) {
        int d = hex_digit(p->text[pos + i]);
        if (d < 0) return -1;
        code = code * 16 + d;
    }
    return code;
}

static size_t put_utf8(char *out, long code) {
    if (code < 0x80) {
        out[0] = (char)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (char)(0xC0 | (code >> 6));
        out[1] = (char)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (char)(0xE0 | (code >> 12));
        out[1] = (char)(0x80 | ((code >> 6) & 0x3F));
        out[2] = (char)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (code >> 18));
    out[1] = (char)(0x80 | ((code >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((code >> 6) & 0x3F));
    out[3] = (char)(0x80 | (code & 0x3F));
    return 4;
}

/* \uXXXX at pos (the 'u'): the code point (a surrogate pair joined) and the position after it; -1 on a failure. */
static long unicode_escape(struct parser *p, size_t pos, int strict, size_t *after) {
    long code = hex4(p, pos + 1);
    if (code < 0) {
        fail(p, pos, "\\u needs 4 hex digits");
        return -1;
    }
    *after = pos + 5;
    if (code >= 0xDC00 && code <= 0xDFFF) {
        fail(p, pos, "a lone low surrogate \\u escape");
        return -1;
    }
    if (code >= 0xD800 && code <= 0xDBFF) {
        long low = (*after + 1 < p->len && p->text[*after] == '\\' && p->text[*after + 1] == 'u') ? hex4(p, *after + 2)
                                                                                                   : -1;
        if (low < 0xDC00 || low > 0xDFFF) {
            fail(p, pos, "a high surrogate \\u escape without its pair");
            return -1;
        }
        code = 0x10000 + (code - 0xD800) * 1024 + (low - 0xDC00);
        *after += 6;
    }
    if (strict && code < 0x20) {
        fail(p, pos, "an escaped control character outside tensor data");
        return -1;
    }
    return code;
}

static const char *simple_escape(char e) {
    switch (e) {
    case '"': return "\"";
    case '\\': return "\\";
    case '/': return "/";
    case 'b': return "\b";
    case 'f': return "\f";
    case 'n': return "\n";
    case 'r': return "\r";
    case 't': return "\t";
    default: return NULL;
    }
}

/* The string whose opening quote is at pos: decoded into the arena (not in DATA mode). The position after it. */
static size_t parse_string(struct parser *p, size_t pos, enum string_mode mode, const char **out, size_t *out_len) {
    char *start = p->arena + p->used;
    size_t at = pos + 1, kept = 0;
    for (;;) {
        size_t stop = at;
        while (stop < p->len) {
            unsigned char c = (unsigned char)p->text[stop];
            if (c < 0x20 || c == '"' || c == '\\') break;
            stop++;
        }
        if (stop >= p->len) return fail(p, pos, "unterminated string");
        char c = p->text[stop];
        if (c != '"' && c != '\\') return fail(p, stop, "a control character inside a string");
        if (mode != DATA) {
            memcpy(start + kept, p->text + at, stop - at);
            kept += stop - at;
        }
        if (c == '"') {
            if (mode != DATA) {
                p->used += kept;
                *out = start;
                *out_len = kept;
            }
            return stop + 1;
        }
        if (mode == KEY && !p->lim.escaped_keys) return fail(p, stop, "an escape sequence in a key (write keys plainly)");
        char e = stop + 1 < p->len ? p->text[stop + 1] : '\0';
        if (e == 'u') {
            long code = unicode_escape(p, stop + 1, mode != DATA, &at);
            if (code < 0) return NO_END;
            if (mode != DATA) kept += put_utf8(start + kept, code);
        } else if (simple_escape(e) != NULL) {
            if (mode != DATA && e != '"' && e != '\\' && e != '/')
                return fail(p, stop, "an escaped control character outside tensor data");
            if (mode != DATA) start[kept++] = simple_escape(e)[0];
            at = stop + 2;
        } else {
            return fail(p, stop, "an invalid escape sequence");
        }
    }
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* An RFC 8259 number at pos that a double holds (rapidjson refuses 1e400): the position after it, or NO_END. */
static size_t number_end(const struct parser *p, size_t pos) {
    size_t at = pos, first;
    if (at < p->len && p->text[at] == '-') at++;
    first = at;
    while (at < p->len && is_digit(p->text[at])) at++;
    if (at == first) return NO_END;
    if (p->text[first] == '0' && at > first + 1) return NO_END; /* a leading zero */
    if (at < p->len && p->text[at] == '.') {
        size_t digits = ++at;
        while (at < p->len && is_digit(p->text[at])) at++;
        if (at == digits) return NO_END;
    }
    int exponent = 0;
    if (at < p->len && (p->text[at] == 'e' || p->text[at] == 'E')) {
        at++;
        if (at < p->len && (p->text[at] == '+' || p->text[at] == '-')) at++;
        size_t digits = at;
        while (at < p->len && is_digit(p->text[at])) at++;
        if (at == digits) return NO_END;
        exponent = 1;
    }
    if (exponent || at - pos > 301) {
        char *copy = strndup(p->text + pos, at - pos);
        if (copy == NULL) return NO_END;
        double value = strtod(copy, NULL);
        free(copy);
        if (isinf(value)) return NO_END;
    }
    return at;
}

static int starts_with(const struct parser *p, size_t pos, const char *word) {
    size_t n = strlen(word);
    return pos + n <= p->len && memcmp(p->text + pos, word, n) == 0;
}

/* A number or literal at pos: its end and kind, or NO_END. NaN and Infinity only in tensor data (kParseNanAndInfFlag). */
static size_t scalar_end(struct parser *p, size_t pos, int in_data, uint8_t *kind) {
    static const char *const literals[] = {"true", "false", "null"};
    static const uint8_t kinds[] = {J_TRUE, J_FALSE, J_NULL};
    for (int i = 0; i < 3; i++) {
        if (pos < p->len && p->text[pos] == literals[i][0] && starts_with(p, pos, literals[i])) {
            *kind = kinds[i];
            return pos + strlen(literals[i]);
        }
    }
    size_t stop = number_end(p, pos);
    *kind = J_NUMBER;
    if (stop != NO_END) return stop;
    if (in_data) {
        static const char *const words[] = {"NaN", "Infinity", "-Infinity"};
        for (int i = 0; i < 3; i++)
            if (starts_with(p, pos, words[i])) return pos + strlen(words[i]);
    }
    int shown = (int)(p->len - pos < 20 ? p->len - pos : 20);
    return fail(p, pos, "unexpected '%.*s'", shown, p->text + pos);
}

static size_t check_after(struct parser *p, size_t at, char closer, char *found) {
    char c = at < p->len ? p->text[at] : '\0';
    if (c != ',' && c != closer) return fail(p, at, "',' or '%c' expected", closer);
    *found = c;
    return at;
}

/* Tensor data at pos (a '['): scalars or nested arrays, checked and counted. The position after it. */
static size_t scan_data(struct parser *p, size_t pos, int depth, int64_t *count, uint8_t *kinds) {
    int level = 0;
    size_t at = pos;
    *count = 0;
    *kinds = 0;
    for (;;) {
        char c = at < p->len ? p->text[at] : '\0';
        if (c == '[') {
            level++;
            if (depth + level > p->lim.max_depth) return fail(p, at, "nested deeper than %d levels", p->lim.max_depth);
            at = skip_space(p, at + 1);
            if (at >= p->len || p->text[at] != ']') continue;
            c = ']';
        } else if (c == '"') {
            if ((at = parse_string(p, at, DATA, NULL, NULL)) == NO_END) return NO_END;
            (*count)++;
            *kinds |= DATA_STRING;
            c = '\0';
        } else {
            uint8_t kind;
            if ((at = scalar_end(p, at, 1, &kind)) == NO_END) return NO_END;
            (*count)++;
            if (kind == J_TRUE || kind == J_FALSE) *kinds |= DATA_BOOLEAN;
            if (kind == J_NULL) *kinds |= DATA_NULL;
            c = '\0';
        }
        for (;;) { /* after a value (or an empty array's '[' when c is ']'): ',' or ']' */
            if (c != ']') {
                at = skip_space(p, at);
                if (check_after(p, at, ']', &c) == NO_END) return NO_END;
            }
            if (c == ',') {
                at = skip_space(p, at + 1);
                break;
            }
            level--;
            at++;
            if (level == 0) return at;
            c = '\0';
        }
    }
}

static size_t parse_value(struct parser *p, size_t pos, int depth, int32_t *out);

static size_t parse_array(struct parser *p, size_t pos, int depth, int32_t self) {
    size_t at = skip_space(p, pos + 1);
    if (at < p->len && p->text[at] == ']') return at + 1;
    for (;;) {
        if ((int)p->nodes[self].count >= p->lim.max_items)
            return fail(p, at, "an array of more than %d items", p->lim.max_items);
        int32_t child;
        if ((at = parse_value(p, at, depth, &child)) == NO_END) return NO_END;
        add_child(p, self, child);
        char c = 0;
        at = skip_space(p, at);
        if (check_after(p, at, ']', &c) == NO_END) return NO_END;
        if (c == ']') return at + 1;
        at = skip_space(p, at + 1);
    }
}

static int32_t member(const struct parser *p, int32_t object, const char *key) {
    size_t n = strlen(key);
    for (int32_t c = p->nodes[object].first; c >= 0; c = p->nodes[c].next)
        if (p->nodes[c].key_len == n && memcmp(p->nodes[c].key, key, n) == 0) return c;
    return -1;
}

static int has_key(const struct parser *p, int32_t object, const char *key, size_t n) {
    for (int32_t c = p->nodes[object].first; c >= 0; c = p->nodes[c].next)
        if (p->nodes[c].key_len == n && memcmp(p->nodes[c].key, key, n) == 0) return 1;
    return n == 4 && memcmp(key, "data", 4) == 0 && p->nodes[object].data >= 0;
}

static size_t parse_object(struct parser *p, size_t pos, int depth, int32_t self) {
    size_t at = skip_space(p, pos + 1);
    int keys = 0;
    if (at < p->len && p->text[at] == '}') return at + 1;
    for (;;) {
        if (at >= p->len || p->text[at] != '"') return fail(p, at, "a key was expected");
        const char *key;
        size_t key_len;
        if ((at = parse_string(p, at, KEY, &key, &key_len)) == NO_END) return NO_END;
        if (has_key(p, self, key, key_len))
            return fail(p, at, "the key '%.*s' appears twice", (int)(key_len < 80 ? key_len : 80), key);
        if (++keys > p->lim.max_keys) return fail(p, at, "an object of more than %d keys", p->lim.max_keys);
        at = skip_space(p, at);
        if (at >= p->len || p->text[at] != ':') return fail(p, at, "':' expected");
        at = skip_space(p, at + 1);
        if (key_len == 4 && memcmp(key, "data", 4) == 0 && at < p->len && p->text[at] == '[') {
            int64_t count;
            uint8_t kinds;
            if ((at = scan_data(p, at, depth, &count, &kinds)) == NO_END) return NO_END;
            p->nodes[self].data = count; /* tensor data: counted, not a member */
            p->nodes[self].data_kinds = kinds;
        } else {
            int32_t child;
            if ((at = parse_value(p, at, depth, &child)) == NO_END) return NO_END;
            p->nodes[child].key = key;
            p->nodes[child].key_len = key_len;
            add_child(p, self, child);
        }
        char c = 0;
        at = skip_space(p, at);
        if (check_after(p, at, '}', &c) == NO_END) return NO_END;
        if (c == '}') return at + 1;
        at = skip_space(p, at + 1);
    }
}

static size_t parse_value(struct parser *p, size_t pos, int depth, int32_t *out) {
    if (depth >= p->lim.max_depth) return fail(p, pos, "nested deeper than %d levels", p->lim.max_depth);
    char c = pos < p->len ? p->text[pos] : '\0';
    if (pos >= p->len) return fail(p, pos, "a value was expected");
    uint8_t kind = c == '{' ? J_OBJECT : c == '[' ? J_ARRAY : c == '"' ? J_STRING : J_NULL;
    size_t stop = pos;
    if (kind == J_NULL && (stop = scalar_end(p, pos, 0, &kind)) == NO_END) return NO_END;
    int32_t self = new_node(p, kind);
    if (self < 0) return fail(p, pos, "more than %u JSON values outside tensor data", p->lim.max_nodes);
    *out = self;
    if (kind == J_OBJECT) return parse_object(p, pos, depth + 1, self);
    if (kind == J_ARRAY) return parse_array(p, pos, depth + 1, self);
    if (kind == J_STRING) {
        const char *text;
        size_t len;
        if ((stop = parse_string(p, pos, VALUE, &text, &len)) == NO_END) return NO_END;
        p->nodes[self].text = text;
        p->nodes[self].len = len;
        return stop;
    }
    p->nodes[self].text = p->text + pos;
    p->nodes[self].len = stop - pos;
    return stop;
}

static void parser_free(struct parser *p) {
    free(p->nodes);
    free(p->arena);
}

/* text as JSON the edge accepts: 0 and the root node, or -1 with p->why set. */
static int parse_json(struct parser *p, const char *text, size_t len, struct limits lim, int32_t *root) {
    memset(p, 0, sizeof *p);
    p->text = text;
    p->len = len;
    p->lim = lim;
    p->arena = malloc(len + 1);
    if (p->arena == NULL) return fail(p, 0, "out of memory"), -1;
    size_t at = parse_value(p, skip_space(p, 0), 0, root);
    if (at == NO_END) return -1;
    at = skip_space(p, at);
    if (at < len) return fail(p, at, "text after the JSON value"), -1;
    return 0;
}

/* ---- the rules ---- */

struct input_rule {
    char *name;
    size_t name_len;
    char datatype[8];
    int rank;
    int64_t *dims;
};

struct model_rule {
    char *name;
    size_t name_len;
    int64_t max_batch_size;
    int count;
    struct input_rule *inputs;
};

struct check_rules {
    struct limits lim;
    uint64_t max_tensor_bytes;
    int count;
    struct model_rule *models; /* sorted by name */
    int refused_count;
    char **refused_override_keys;
};

static const struct {
    const char *name;
    unsigned size;
} SIZES[] = {{"BOOL", 1},  {"INT8", 1},   {"UINT8", 1},  {"INT16", 2},  {"UINT16", 2}, {"FP16", 2}, {"BF16", 2},
             {"INT32", 4}, {"UINT32", 4}, {"FP32", 4},   {"INT64", 8},  {"UINT64", 8}, {"FP64", 8}, {"BYTES", 4}};

static unsigned size_of(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++)
        if (strlen(SIZES[i].name) == len && memcmp(SIZES[i].name, name, len) == 0) return SIZES[i].size;
    return 0;
}

static int compare_models(const void *a, const void *b) {
    const struct model_rule *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static char *copy_text(const struct node *n, size_t *len) {
    char *copy = malloc(n->len + 1);
    if (copy == NULL) return NULL;
    memcpy(copy, n->text, n->len);
    copy[n->len] = '\0';
    if (len) *len = n->len;
    return copy;
}

static int64_t integer_of(const struct parser *p, int32_t n, int64_t fallback) {
    if (n < 0 || p->nodes[n].kind != J_NUMBER || p->nodes[n].len > 20) return fallback;
    char text[24];
    memcpy(text, p->nodes[n].text, p->nodes[n].len);
    text[p->nodes[n].len] = '\0';
    char *end;
    long long value = strtoll(text, &end, 10);
    return *end == '\0' ? value : fallback;
}

static int load_input(const struct parser *p, int32_t node, struct input_rule *rule) {
    int32_t datatype = member(p, node, "datatype"), dims = member(p, node, "dims");
    if (datatype < 0 || p->nodes[datatype].kind != J_STRING || p->nodes[datatype].len >= sizeof rule->datatype) return -1;
    if (dims < 0 || p->nodes[dims].kind != J_ARRAY) return -1;
    memcpy(rule->datatype, p->nodes[datatype].text, p->nodes[datatype].len);
    rule->rank = (int)p->nodes[dims].count;
    rule->dims = calloc((size_t)rule->rank + 1, sizeof *rule->dims);
    if (rule->dims == NULL) return -1;
    int i = 0;
    for (int32_t d = p->nodes[dims].first; d >= 0; d = p->nodes[d].next) {
        rule->dims[i] = integer_of(p, d, INT64_MIN);
        if (rule->dims[i++] == INT64_MIN) return -1;
    }
    return 0;
}

static int load_model(const struct parser *p, int32_t node, struct model_rule *model) {
    if (p->nodes[node].kind != J_OBJECT) return -1;
    model->name = malloc(p->nodes[node].key_len + 1);
    if (model->name == NULL) return -1;
    memcpy(model->name, p->nodes[node].key, p->nodes[node].key_len);
    model->name[p->nodes[node].key_len] = '\0';
    model->name_len = p->nodes[node].key_len;
    model->max_batch_size = integer_of(p, member(p, node, "max_batch_size"), -1);
    int32_t inputs = member(p, node, "inputs");
    if (model->max_batch_size < 0 || inputs < 0 || p->nodes[inputs].kind != J_OBJECT) return -1;
    model->inputs = calloc((size_t)p->nodes[inputs].count + 1, sizeof *model->inputs);
    if (model->inputs == NULL) return -1;
    for (int32_t i = p->nodes[inputs].first; i >= 0; i = p->nodes[i].next) {
        struct input_rule *rule = &model->inputs[model->count++];
        rule->name = malloc(p->nodes[i].key_len + 1);
        if (rule->name == NULL) return -1;
        memcpy(rule->name, p->nodes[i].key, p->nodes[i].key_len);
        rule->name[p->nodes[i].key_len] = '\0';
        rule->name_len = p->nodes[i].key_len;
        if (p->nodes[i].kind != J_OBJECT || load_input(p, i, rule) < 0) return -1;
    }
    return 0;
}

void check_rules_free(struct check_rules *rules) {
    if (rules == NULL) return;
    for (int m = 0; m < rules->count; m++) {
        for (int i = 0; i < rules->models[m].count; i++) {
            free(rules->models[m].inputs[i].name);
            free(rules->models[m].inputs[i].dims);
        }
        free(rules->models[m].inputs);
        free(rules->models[m].name);
    }
    for (int k = 0; k < rules->refused_count; k++) free(rules->refused_override_keys[k]);
    free(rules->refused_override_keys);
    free(rules->models);
    free(rules);
}

static int load_rules(const struct parser *p, int32_t root, struct check_rules *rules) {
    if (p->nodes[root].kind != J_OBJECT) return -1;
    rules->lim.max_depth = (int)integer_of(p, member(p, root, "max_depth"), 0);
    rules->lim.max_keys = (int)integer_of(p, member(p, root, "max_keys"), 0);
    rules->lim.max_items = (int)integer_of(p, member(p, root, "max_items"), 0);
    rules->lim.max_nodes = 1u << 16;
    int64_t tensor = integer_of(p, member(p, root, "max_tensor_bytes"), 0);
    if (rules->lim.max_depth < 8 || rules->lim.max_keys < 1 || rules->lim.max_items < 1 || tensor < 1) return -1;
    rules->max_tensor_bytes = (uint64_t)tensor;
    int32_t models = member(p, root, "models"), refused = member(p, root, "refused_override_keys");
    if (models < 0 || p->nodes[models].kind != J_OBJECT || refused < 0 || p->nodes[refused].kind != J_ARRAY) return -1;
    rules->models = calloc((size_t)p->nodes[models].count + 1, sizeof *rules->models);
    rules->refused_override_keys = calloc((size_t)p->nodes[refused].count + 1, sizeof(char *));
    if (rules->models == NULL || rules->refused_override_keys == NULL) return -1;
    for (int32_t m = p->nodes[models].first; m >= 0; m = p->nodes[m].next)
        if (load_model(p, m, &rules->models[rules->count++]) < 0) return -1;
    for (int32_t k = p->nodes[refused].first; k >= 0; k = p->nodes[k].next) {
        if (p->nodes[k].kind != J_STRING) return -1;
        if ((rules->refused_override_keys[rules->refused_count++] = copy_text(&p->nodes[k], NULL)) == NULL) return -1;
    }
    qsort(rules->models, (size_t)rules->count, sizeof *rules->models, compare_models);
    return 0;
}

struct check_rules *check_rules_load(const char *text, size_t len, char *why, size_t why_room) {
    struct parser p;
    int32_t root;
    struct limits lim = {16, 1 << 20, 1 << 20, 1u << 24, 1};
    if (parse_json(&p, text, len, lim, &root) < 0) {
        snprintf(why, why_room, "the rules are not JSON: %s", p.why);
        parser_free(&p);
        return NULL;
    }
    struct check_rules *rules = calloc(1, sizeof *rules);
    if (rules == NULL || load_rules(&p, root, rules) < 0) {
        snprintf(why, why_room, "the rules lack a limit, the models or the refused override keys, or name one "
                                "wrongly (server/edge/request_checks.py writes them)");
        check_rules_free(rules);
        parser_free(&p);
        return NULL;
    }
    parser_free(&p);
    return rules;
}

static const struct model_rule *model_of(const struct check_rules *rules, const char *name, size_t len) {
    struct model_rule key = {.name = (char *)name, .name_len = len};
    return bsearch(&key, rules->models, (size_t)rules->count, sizeof key, compare_models);
}

long check_max_batch_size(const struct check_rules *rules, const char *model, size_t model_len) {
    const struct model_rule *found = rules != NULL ? model_of(rules, model, model_len) : NULL;
    return found != NULL ? (long)found->max_batch_size : -1;
}

/* ---- the checks of one request ---- */

struct check {
    const struct check_rules *rules;
    const struct check_request *request;
    struct check_verdict *verdict;
    struct parser json;
    size_t reading_used;
};

static int refuse(struct check *c, int status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(c->verdict->why, sizeof c->verdict->why, format, args);
    va_end(args);
    c->verdict->status = status;
    return status;
}

#define NAME_SHOWN(n) (int)((n)->len < 80 ? (n)->len : 80), (n)->text

static int kind_is(const struct parser *p, int32_t n, uint8_t kind) { return n >= 0 && p->nodes[n].kind == kind; }

static int text_is(const struct node *n, const char *text) {
    return n->kind == J_STRING && n->len == strlen(text) && memcmp(n->text, text, n->len) == 0;
}

/* A whole number as the edge reads one: plain digits, no sign, fraction, exponent or leading zero, at most 15. */
static int whole(const struct parser *p, int32_t n, int64_t *value) {
    if (!kind_is(p, n, J_NUMBER)) return 0;
    const struct node *x = &p->nodes[n];
    if (x->len == 0 || x->len > 15 || (x->len > 1 && x->text[0] == '0')) return 0;
    int64_t v = 0;
    for (size_t i = 0; i < x->len; i++) {
        if (!is_digit(x->text[i])) return 0;
        v = v * 10 + (x->text[i] - '0');
    }
    *value = v;
    return 1;
}

static uint64_t times(uint64_t a, uint64_t b) {
    uint64_t product;
    return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
}

/* The first key of object that allowed (a NULL-ended list) lacks, or -1. */
static int32_t unknown_key(const struct parser *p, int32_t object, const char *const *allowed) {
    for (int32_t c = p->nodes[object].first; c >= 0; c = p->nodes[c].next) {
        int known = 0;
        for (const char *const *a = allowed; *a && !known; a++)
            known = p->nodes[c].key_len == strlen(*a) && memcmp(p->nodes[c].key, *a, p->nodes[c].key_len) == 0;
        if (!known) return c;
    }
    return -1;
}

/* Whether key is the call id's name in any case: tritonserver hands a request's parameters and its forwarded
 * headers to the model as one set, and the model reads that name in any case (cancelled_calls.py). */
static int is_call_id(const char *key, size_t len) {
    return len == strlen(CALL_ID_NAME) && strncasecmp(key, CALL_ID_NAME, len) == 0;
}

/* request: the request's own parameters (not a tensor's), where the call id's name is the server's own. */
static int check_parameters(struct check *c, int32_t params, const char *label, int request) {
    const struct parser *p = &c->json;
    if (params < 0) return 0;
    if (!kind_is(p, params, J_OBJECT)) return refuse(c, 400, "%shas parameters that are not an object", label);
    for (int32_t v = p->nodes[params].first; v >= 0; v = p->nodes[v].next) {
        uint8_t k = p->nodes[v].kind;
        if (k == J_OBJECT || k == J_ARRAY || k == J_NULL)
            return refuse(c, 400, "%shas parameter '%.*s' that is not a string, number or boolean", label,
                          (int)(p->nodes[v].key_len < 80 ? p->nodes[v].key_len : 80), p->nodes[v].key);
        if (request && is_call_id(p->nodes[v].key, p->nodes[v].key_len))
            return refuse(c, 400, "%shas parameter '%.*s': the server's own (each call's id): leave it out", label,
                          (int)p->nodes[v].key_len, p->nodes[v].key);
    }
    return 0;
}

static void dims_text(char *out, size_t room, const int64_t *dims, int rank, int batch) {
    size_t used = (size_t)snprintf(out, room, "%s[", batch ? "[batch]+" : "");
    for (int i = 0; i < rank && used < room; i++)
        used += (size_t)snprintf(out + used, room - used, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (used < room) snprintf(out + used, room - used, "]");
}

static int against_config(struct check *c, const char *label, const struct model_rule *model, const struct node *name,
                          const struct node *datatype, const int64_t *shape, int rank) {
    if (model == NULL) return 0;
    const struct input_rule *want = NULL;
    for (int i = 0; i < model->count && want == NULL; i++)
        if (model->inputs[i].name_len == name->len && memcmp(model->inputs[i].name, name->text, name->len) == 0)
            want = &model->inputs[i];
    if (want == NULL) return refuse(c, 400, "%sis not an input of %s", label, model->name);
    if (datatype->len != strlen(want->datatype) || memcmp(datatype->text, want->datatype, datatype->len) != 0)
        return refuse(c, 400, "%shas datatype %.*s, the model takes %s", label, NAME_SHOWN(datatype), want->datatype);
    char got[160], takes[160];
    dims_text(got, sizeof got, shape, rank, 0);
    int first = model->max_batch_size > 0;
    dims_text(takes, sizeof takes, want->dims, want->rank, first);
    if (rank != want->rank + first) return refuse(c, 400, "%shas shape %s, the model takes %s", label, got, takes);
    if (first && (shape[0] < 1 || shape[0] > model->max_batch_size))
        return refuse(c, 400, "%shas batch %lld, the model takes 1..%lld", label, (long long)shape[0],
                      (long long)model->max_batch_size);
    for (int i = 0; i < want->rank; i++)
        if (want->dims[i] != -1 && shape[i + first] != want->dims[i])
            return refuse(c, 400, "%shas shape %s, the model takes %s", label, got, takes);
    return 0;
}

static void add_reading(struct check *c, const char *format, ...) {
    size_t room = sizeof c->verdict->reading;
    if (c->reading_used >= room - 1) return;
    va_list args;
    va_start(args, format);
    int n = vsnprintf(c->verdict->reading + c->reading_used, room - c->reading_used, format, args);
    va_end(args);
    if (n > 0) c->reading_used += (size_t)n < room - c->reading_used ? (size_t)n : room - 1 - c->reading_used;
}

/* Where the input's data comes from, as Triton takes it: binary data first, then shared memory, then JSON. */
static int data_source(struct check *c, int32_t input, int32_t params, const char *label, uint64_t elements,
                       unsigned size, const struct node *datatype, uint64_t *binary_left) {
    int is_bytes = text_is(datatype, "BYTES"), is_bool = text_is(datatype, "BOOL");
    const struct parser *p = &c->json;
    int32_t binary = params >= 0 ? member(p, params, "binary_data_size") : -1;
    int32_t region = params >= 0 ? member(p, params, "shared_memory_region") : -1;
    int64_t n;
    if (binary >= 0) {
        if (!whole(p, binary, &n)) return refuse(c, 400, "%shas a binary_data_size that is not a plain whole number", label);
        if ((uint64_t)n > *binary_left)
            return refuse(c, 400, "%shas binary_data_size %lld beyond the %llu bytes left in the body", label,
                          (long long)n, (unsigned long long)*binary_left);
        if (!is_bytes && (uint64_t)n != times(elements, size))
            return refuse(c, 400, "%sdeclares %llu bytes of its datatype but sends %lld", label,
                          (unsigned long long)times(elements, size), (long long)n);
        *binary_left -= (uint64_t)n;
        add_reading(c, ":binary %lld", (long long)n);
        return 0;
    }
    if (region >= 0) {
        if (!kind_is(p, region, J_STRING))
            return refuse(c, 400, "%snames a shared memory region that is not a string", label);
        static const char *const sizes[] = {"shared_memory_byte_size", "shared_memory_offset"};
        for (int i = 0; i < 2; i++) {
            int32_t v = member(p, params, sizes[i]);
            if (v >= 0 && !whole(p, v, &n)) return refuse(c, 400, "%shas a %s that is not a plain whole number", label, sizes[i]);
        }
        add_reading(c, ":shm %.*s", NAME_SHOWN(&p->nodes[region]));
        return 0;
    }
    int64_t count = p->nodes[input].data;
    if (count < 0) return refuse(c, 400, "%shas no data (an array), binary_data_size or shared_memory_region", label);
    if ((uint64_t)count != elements)
        return refuse(c, 400, "%sdeclares %llu elements but its data holds %lld", label, (unsigned long long)elements,
                      (long long)count);
    uint8_t kinds = p->nodes[input].data_kinds;
    const char *odd = is_bytes ? NULL : (kinds & DATA_STRING) ? "a string" : (kinds & DATA_NULL) ? "null"
                      : (kinds & DATA_BOOLEAN) && !is_bool ? "true or false" : NULL;
    if (odd != NULL)
        return refuse(c, 400, "%shas %s in its %.*s data: give %s (NaN and Infinity unquoted)", label, odd,
                      NAME_SHOWN(datatype), is_bool ? "true or false" : "numbers");
    add_reading(c, ":json %lld", (long long)count);
    return 0;
}

static int check_input(struct check *c, const struct model_rule *model, int32_t input, uint64_t *binary_left) {
    static const char *const keys[] = {"name", "shape", "datatype", "parameters", "data", NULL};
    const struct parser *p = &c->json;
    int32_t name = kind_is(p, input, J_OBJECT) ? member(p, input, "name") : -1;
    if (!kind_is(p, name, J_STRING) || p->nodes[name].len == 0) return refuse(c, 400, "an input has no name");
    const struct node *n = &p->nodes[name];
    char label[120];
    snprintf(label, sizeof label, "input '%.*s' ", NAME_SHOWN(n));
    int32_t extra = unknown_key(p, input, keys);
    if (extra >= 0)
        return refuse(c, 400, "%shas an unknown key '%.*s'", label, (int)(p->nodes[extra].key_len < 80 ? p->nodes[extra].key_len : 80),
                      p->nodes[extra].key);
    int32_t datatype = member(p, input, "datatype");
    unsigned size = kind_is(p, datatype, J_STRING) ? size_of(p->nodes[datatype].text, p->nodes[datatype].len) : 0;
    if (size == 0) {
        if (kind_is(p, datatype, J_STRING)) return refuse(c, 400, "%shas unknown datatype %.*s", label, NAME_SHOWN(&p->nodes[datatype]));
        return refuse(c, 400, "%shas unknown datatype", label);
    }
    int32_t shape = member(p, input, "shape");
    if (!kind_is(p, shape, J_ARRAY) || p->nodes[shape].count == 0)
        return refuse(c, 400, "%shas no shape (an array of dimensions)", label);
    int64_t dims[128];
    int rank = 0;
    uint64_t elements = 1;
    int zero = 0;
    for (int32_t d = p->nodes[shape].first; d >= 0; d = p->nodes[d].next) {
        int64_t value;
        if (!whole(p, d, &value) || value >= 2147483648LL) {
            const struct node *x = &p->nodes[d];
            return refuse(c, 400, "%shas shape dimension %.*s: dimensions are whole numbers in [0, 2^31), written plainly",
                          label, x->kind == J_NUMBER || x->kind == J_STRING ? (int)(x->len < 40 ? x->len : 40) : 1,
                          x->kind == J_NUMBER || x->kind == J_STRING ? x->text : "?");
        }
        if (rank < 128) dims[rank] = value;
        rank++;
        if (value == 0) zero = 1;
        else elements = times(elements, (uint64_t)value);
    }
    if (zero) elements = 0;
    if (rank > 128) return refuse(c, 400, "%shas more than 128 dimensions", label);
    if (against_config(c, label, model, n, &p->nodes[datatype], dims, rank)) return c->verdict->status;
    if (times(elements, size) > c->rules->max_tensor_bytes)
        return refuse(c, 400, "%sdeclares %llu elements of %.*s: over the limit of %llu bytes per tensor", label,
                      (unsigned long long)elements, NAME_SHOWN(&p->nodes[datatype]),
                      (unsigned long long)c->rules->max_tensor_bytes);
    int32_t params = member(p, input, "parameters");
    if (check_parameters(c, params, label, 0)) return c->verdict->status;
    char shape_text[160];
    dims_text(shape_text, sizeof shape_text, dims, rank, 0);
    add_reading(c, "%s%.*s:%.*s:%s", c->reading_used ? ";" : "", NAME_SHOWN(n), NAME_SHOWN(&p->nodes[datatype]), shape_text);
    if (c->request->seen != NULL) {
        struct check_input_seen seen = {n->text, n->len, p->nodes[datatype].text, p->nodes[datatype].len, dims, rank};
        c->request->seen(c->request->seen_arg, &seen);
    }
    return data_source(c, input, params, label, elements, size, &p->nodes[datatype], binary_left);
}

int check_input_tensor(const struct check_rules *rules, const char *model, size_t model_len, const char *name,
                       size_t name_len, const char *datatype, size_t datatype_len, const int64_t *shape, int rank,
                       struct check_verdict *verdict) {
    verdict->status = 0, verdict->why[0] = 0, verdict->reading[0] = 0;
    const struct model_rule *found = rules != NULL ? model_of(rules, model, model_len) : NULL;
    if (found == NULL) return 0; /* a model the rules do not know: tritonserver answers for it */
    struct check c = {.rules = rules, .verdict = verdict};
    struct node n = {.text = name, .len = name_len}, d = {.text = datatype, .len = datatype_len};
    char label[120];
    snprintf(label, sizeof label, "input '%.*s' ", NAME_SHOWN(&n));
    if (size_of(datatype, datatype_len) == 0) return refuse(&c, 400, "%shas unknown datatype %.*s", label, NAME_SHOWN(&d));
    if (rank > 128) return refuse(&c, 400, "%shas more than 128 dimensions", label);
    return against_config(&c, label, found, &n, &d, shape, rank);
}

static int check_outputs(struct check *c, int32_t outputs) {
    static const char *const keys[] = {"name", "parameters", NULL};
    const struct parser *p = &c->json;
    if (outputs < 0) return 0;
    if (!kind_is(p, outputs, J_ARRAY)) return refuse(c, 400, "'outputs' is not an array");
    for (int32_t o = p->nodes[outputs].first; o >= 0; o = p->nodes[o].next) {
        int32_t name = kind_is(p, o, J_OBJECT) ? member(p, o, "name") : -1;
        if (!kind_is(p, name, J_STRING)) return refuse(c, 400, "an output has no name");
        char label[120];
        snprintf(label, sizeof label, "output '%.*s' ", NAME_SHOWN(&p->nodes[name]));
        int32_t extra = unknown_key(p, o, keys);
        if (extra >= 0)
            return refuse(c, 400, "%shas an unknown key '%.*s'", label,
                          (int)(p->nodes[extra].key_len < 80 ? p->nodes[extra].key_len : 80), p->nodes[extra].key);
        if (check_parameters(c, member(p, o, "parameters"), label, 0)) return c->verdict->status;
    }
    return 0;
}

static int read_json(struct check *c, const char *text, size_t len, const char *what, int32_t *root) {
    parser_free(&c->json);
    if (parse_json(&c->json, text, len, c->rules->lim, root) == 0) return 0;
    return refuse(c, 400, "%s is not JSON the edge accepts: %s", what, c->json.why);
}

static int blank(const char *text, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\n') return 0;
    return 1;
}

static int check_infer(struct check *c, const char *model_name, size_t model_len) {
    const struct check_request *r = c->request;
    const char *json = r->body;
    size_t json_len = r->body_len;
    uint64_t binary_left = 0;
    if (r->header_length != NULL) {
        if (r->header_length_count > 1)
            return refuse(c, 400, "the header inference-header-content-length appears %d times", r->header_length_count);
        const char *h = r->header_length;
        size_t n = r->header_length_len;
        int plain = n >= 1 && n <= 9 && !(n > 1 && h[0] == '0');
        for (size_t i = 0; i < n && plain; i++) plain = is_digit(h[i]);
        if (!plain)
            return refuse(c, 400, "Inference-Header-Content-Length '%.*s' is not a plain whole number", (int)(n < 20 ? n : 20), h);
        size_t value = (size_t)strtoul(strndupa(h, n), NULL, 10);
        if (value > r->body_len)
            return refuse(c, 400, "Inference-Header-Content-Length %zu is beyond the body's %zu bytes", value, r->body_len);
        json_len = value;
        binary_left = r->body_len - value;
    }
    int32_t root;
    if (read_json(c, json, json_len, "the request", &root)) return c->verdict->status;
    const struct parser *p = &c->json;
    int32_t inputs = kind_is(p, root, J_OBJECT) ? member(p, root, "inputs") : -1;
    if (!kind_is(p, inputs, J_ARRAY) || p->nodes[inputs].count == 0) return refuse(c, 400, "the request has no inputs");
    static const char *const keys[] = {"id", "parameters", "inputs", "outputs", NULL};
    int32_t extra = unknown_key(p, root, keys);
    if (extra >= 0)
        return refuse(c, 400, "the request has an unknown key '%.*s'",
                      (int)(p->nodes[extra].key_len < 80 ? p->nodes[extra].key_len : 80), p->nodes[extra].key);
    if (check_parameters(c, member(p, root, "parameters"), "the request ", 1)) return c->verdict->status;
    if (check_outputs(c, member(p, root, "outputs"))) return c->verdict->status;
    const struct model_rule *model = model_of(c->rules, model_name, model_len);
    for (int32_t i = p->nodes[inputs].first; i >= 0; i = p->nodes[i].next) {
        if (check_input(c, model, i, &binary_left)) {
            size_t used = strlen(c->verdict->why);
            snprintf(c->verdict->why + used, sizeof c->verdict->why - used, " (refused at the edge, before the server)");
            return c->verdict->status;
        }
    }
    return 0;
}

static int outside_folder(const struct node *name) {
    if (name->len == 0) return 0;
    for (size_t i = 0; i < name->len; i++)
        if (name->text[i] == '/' || name->text[i] == '\\' || name->text[i] == '\0') return 1;
    return text_is(name, ".") || text_is(name, "..");
}

static int check_override(struct check *c, const struct node *config) {
    struct check inner = {.rules = c->rules, .request = c->request, .verdict = c->verdict};
    int32_t root;
    int status = read_json(&inner, config->text, config->len, "the config override", &root); /* decoded: our copy */
    const struct parser *p = &inner.json;
    if (status == 0 && !kind_is(p, root, J_OBJECT)) status = refuse(c, 400, "the config override is not a JSON object");
    if (status == 0) {
        int32_t filename = member(p, root, "default_model_filename");
        if (filename >= 0 && (!kind_is(p, filename, J_STRING) || outside_folder(&p->nodes[filename])))
            status = refuse(c, 403, "default_model_filename must name a file inside the model's version folder (no '/', '..')");
    }
    for (int k = 0; status == 0 && k < c->rules->refused_count; k++)
        if (member(p, root, c->rules->refused_override_keys[k]) >= 0)
            status = refuse(c, 403, "a config override cannot set '%s': change the repository instead",
                            c->rules->refused_override_keys[k]);
    parser_free(&inner.json);
    return status;
}

static int check_load(struct check *c) {
    const struct check_request *r = c->request;
    if (blank(r->body, r->body_len)) return 0;
    int32_t root;
    if (read_json(c, r->body, r->body_len, "the load request", &root)) return c->verdict->status;
    const struct parser *p = &c->json;
    if (!kind_is(p, root, J_OBJECT)) return refuse(c, 400, "the load request is not a JSON object");
    int32_t params = member(p, root, "parameters");
    if (params < 0) return 0;
    if (!kind_is(p, params, J_OBJECT)) return refuse(c, 400, "the load request's parameters are not an object");
    for (int32_t k = p->nodes[params].first; k >= 0; k = p->nodes[k].next)
        if (p->nodes[k].key_len >= 5 && memcmp(p->nodes[k].key, "file:", 5) == 0)
            return refuse(c, 403, "a load cannot carry files (%.*s): put the model in the repository and load it by name",
                          (int)(p->nodes[k].key_len < 80 ? p->nodes[k].key_len : 80), p->nodes[k].key);
    int32_t config = member(p, params, "config");
    if (config < 0) return 0;
    if (!kind_is(p, config, J_STRING)) return refuse(c, 400, "the config override is not a string");
    return check_override(c, &p->nodes[config]);
}

#define RESERVED_REGIONS "triton_python_backend" /* the Python backend's IPC regions (wrappers.c) */

static int check_shm_register(struct check *c) {
    const struct check_request *r = c->request;
    if (blank(r->body, r->body_len)) return 0;
    int32_t root;
    if (read_json(c, r->body, r->body_len, "the registration", &root)) return c->verdict->status;
    const struct parser *p = &c->json;
    int32_t key = kind_is(p, root, J_OBJECT) ? member(p, root, "key") : -1;
    if (!kind_is(p, key, J_STRING)) return 0;
    const struct node *k = &p->nodes[key];
    size_t at = 0;
    while (at < k->len && k->text[at] == '/') at++;
    size_t n = strlen(RESERVED_REGIONS);
    if (k->len - at >= n && memcmp(k->text + at, RESERVED_REGIONS, n) == 0)
        return refuse(c, 403, "shared-memory names beginning '" RESERVED_REGIONS "' are the server's own memory (the "
                              "Python backend's); register a region your client created");
    return 0;
}

static int check_body(struct check *c) {
    int32_t root;
    if (blank(c->request->body, c->request->body_len)) return 0;
    return read_json(c, c->request->body, c->request->body_len, "the body", &root) ? c->verdict->status : 0;
}

/* ---- routes: the paths Triton serves that reach it through the edge ---- */

enum body_check { NONE, INFER, BODY, LOAD, SHM };

struct route {
    const char *method;
    const char *segments; /* after "/": N a name ([A-Za-z0-9_.-]+), V a version (digits) */
    enum body_check check;
};

static const struct route ROUTES[] = {
    {"GET", "v2", NONE},
    {"GET", "v2/health/live", NONE},
    {"GET", "v2/health/ready", NONE},
    {"GET", "v2/models/stats", NONE},
    {"GET", "v2/models/N", NONE},
    {"GET", "v2/models/N/versions/V", NONE},
    {"GET", "v2/models/N/ready", NONE},
    {"GET", "v2/models/N/versions/V/ready", NONE},
    {"GET", "v2/models/N/config", NONE},
    {"GET", "v2/models/N/versions/V/config", NONE},
    {"GET", "v2/models/N/stats", NONE},
    {"GET", "v2/models/N/versions/V/stats", NONE},
    {"POST", "v2/models/N/infer", INFER},
    {"POST", "v2/models/N/versions/V/infer", INFER},
    {"POST", "v2/repository/index", BODY},
    {"POST", "v2/repository/models/N/load", LOAD},
    {"POST", "v2/repository/models/N/unload", BODY},
    {"GET", "v2/systemsharedmemory/status", NONE},
    {"GET", "v2/systemsharedmemory/region/N/status", NONE},
    {"POST", "v2/systemsharedmemory/region/N/register", SHM},
    {"POST", "v2/systemsharedmemory/region/N/unregister", BODY},
    {"POST", "v2/systemsharedmemory/unregister", BODY},
    {"GET", "v2/cudasharedmemory/status", NONE},
    {"GET", "v2/cudasharedmemory/region/N/status", NONE},
    {"POST", "v2/cudasharedmemory/region/N/register", BODY},
    {"POST", "v2/cudasharedmemory/region/N/unregister", BODY},
    {"POST", "v2/cudasharedmemory/unregister", BODY},
    {"GET", "v2/trace/setting", NONE},
    {"POST", "v2/trace/setting", BODY},
    {"GET", "v2/models/N/trace/setting", NONE},
    {"POST", "v2/models/N/trace/setting", BODY},
    {"GET", "v2/logging", NONE},
    {"POST", "v2/logging", BODY},
};

static int name_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '_' || c == '.' || c == '-';
}

/* Whether path (after its leading '/') has the route's segments; the first name in it. */
static int path_matches(const char *path, size_t len, const char *segments, const char **name, size_t *name_len) {
    size_t at = 0;
    const char *s = segments;
    *name = NULL;
    while (*s) {
        const char *slash = strchr(s, '/');
        size_t seg = slash ? (size_t)(slash - s) : strlen(s);
        size_t start = at;
        if (seg == 1 && (*s == 'N' || *s == 'V')) {
            while (at < len && path[at] != '/' && (*s == 'N' ? name_char(path[at]) : is_digit(path[at]))) at++;
            if (at == start || (at < len && path[at] != '/')) return 0;
            if (*s == 'N' && *name == NULL) {
                *name = path + start;
                *name_len = at - start;
            }
        } else {
            if (len - at < seg || memcmp(path + at, s, seg) != 0) return 0;
            at += seg;
        }
        s += seg;
        if (*s == '/') {
            if (at >= len || path[at] != '/') return 0;
            at++;
            s++;
        }
    }
    return at == len;
}

void check_http_request(const struct check_rules *rules, const struct check_request *r, struct check_verdict *verdict) {
    struct check c = {.rules = rules, .request = r, .verdict = verdict};
    memset(verdict, 0, sizeof *verdict);
    int get = r->method_len == 3 && memcmp(r->method, "GET", 3) == 0;
    int post = r->method_len == 4 && memcmp(r->method, "POST", 4) == 0;
    if (!get && !post) {
        refuse(&c, 405, "method %.*s is not served here", (int)(r->method_len < 20 ? r->method_len : 20), r->method);
        return;
    }
    for (size_t i = 0; i < r->path_len; i++) {
        if (r->path[i] == '?' || r->path[i] == '#' || r->path[i] == '%') {
            refuse(&c, 400, "paths with a query, fragment or percent-escape are not served here");
            return;
        }
    }
    const struct route *route = NULL;
    const char *name = NULL;
    size_t name_len = 0;
    int known_path = 0;
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0] && route == NULL; i++) {
        const char *found;
        size_t found_len = 0;
        if (r->path_len < 1 || r->path[0] != '/' ||
            !path_matches(r->path + 1, r->path_len - 1, ROUTES[i].segments, &found, &found_len))
            continue;
        known_path = 1;
        if (found != NULL) {
            size_t dots = 0;
            while (dots < found_len && found[dots] == '.') dots++;
            if (dots == found_len) {
                refuse(&c, 400, "a name made of dots is not a model or region name");
                return;
            }
        }
        if (strcmp(ROUTES[i].method, get ? "GET" : "POST") == 0) {
            route = &ROUTES[i];
            name = found;
            name_len = found_len;
        }
    }
    if (route == NULL) {
        int shown = (int)(r->path_len < 80 ? r->path_len : 80);
        if (known_path) refuse(&c, 405, "%s %.*s is not served here", get ? "GET" : "POST", shown, r->path);
        else refuse(&c, 404, "%.*s is not a path the edge serves (generate and generate_stream are not served)", shown, r->path);
        return;
    }
    if (r->content_encoding != NULL) {
        if (r->content_encoding_count > 1) {
            refuse(&c, 400, "the header content-encoding appears %d times", r->content_encoding_count);
            return;
        }
        if (r->content_encoding_len != 8 || memcmp(r->content_encoding, "identity", 8) != 0) {
            refuse(&c, 415, "Content-Encoding '%.*s' is not accepted at the edge: send the body uncompressed",
                   (int)(r->content_encoding_len < 20 ? r->content_encoding_len : 20), r->content_encoding);
            return;
        }
    }
    switch (route->check) {
    case INFER: check_infer(&c, name, name_len); break;
    case BODY: check_body(&c); break;
    case LOAD: check_load(&c); break;
    case SHM: check_shm_register(&c); break;
    case NONE: break;
    }
    parser_free(&c.json);
    if (verdict->status) verdict->reading[0] = '\0';
}
