/* A BERT-style tokenizer for texts of printable ASCII (bert_tokenize.h).
 *
 * For printable ASCII plus tab, newline and carriage return, BertNormalizer, BertPreTokenizer and WordPiece come
 * down to this: whitespace splits words, each ASCII punctuation character is a word of its own, letters are
 * lowercased where the normalizer lowercases (no accents to strip, no control characters to remove, no CJK
 * characters to split), and WordPiece takes the longest piece of the vocabulary first, its prefix ("##") before
 * a word's later pieces; a word with no reading, or longer than max_input_chars_per_word, is the unknown token.
 * The text's own ids are cut to the room truncation leaves, then the special tokens go around them. */
#include "bert_tokenize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint64_t FNV_START = 14695981039346656037ULL;

static uint64_t fnv(uint64_t hash, const char* bytes, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) hash = (hash ^ (unsigned char)bytes[i]) * 1099511628211ULL;
  return hash;
}

/* The id of prefix + piece in the vocabulary, or -1. */
static int64_t lookup(const ipt_vocab* v, const char* prefix, uint64_t prefix_bytes, const char* piece, uint64_t n) {
  uint64_t hash = fnv(fnv(FNV_START, prefix, prefix_bytes), piece, n);
  for (uint64_t at = hash & v->mask;; at = (at + 1) & v->mask) {
    const ipt_entry* e = &v->table[at];
    if (e->id < 0) return -1;
    if (e->hash == hash && e->length == prefix_bytes + n && memcmp(v->pool + e->offset, prefix, prefix_bytes) == 0 &&
        memcmp(v->pool + e->offset + prefix_bytes, piece, n) == 0) {
      return e->id;
    }
  }
}

static int is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_punctuation(unsigned char c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}
static int is_read_here(unsigned char c) { return (c >= 0x20 && c < 0x7F) || c == '\t' || c == '\n' || c == '\r'; }

/* WordPiece over one word: its ids appended at out[*count], up to room. */
static void word_pieces(const ipt_vocab* v, const char* word, uint64_t n, int64_t* out, int64_t* count, int64_t room) {
  if (*count >= room) return;
  if (n > v->spec.max_chars) {
    out[(*count)++] = v->spec.unk_id;
    return;
  }
  int64_t pieces[IPT_MAX_CHARS]; /* a piece a character at most */
  int64_t found = 0;
  for (uint64_t start = 0; start < n;) {
    uint64_t end = n - start > v->longest_word ? start + v->longest_word : n;
    int64_t id = -1;
    for (; end > start && id < 0; --end) {
      id = start ? lookup(v, v->prefix, v->prefix_bytes, word + start, end - start) : lookup(v, "", 0, word, end);
    }
    if (id < 0) { /* no reading: the whole word is the unknown token */
      out[(*count)++] = v->spec.unk_id;
      return;
    }
    pieces[found++] = id;
    start = end + 1;
  }
  for (int64_t i = 0; i < found && *count < room; ++i) out[(*count)++] = pieces[i];
}

int64_t ipt_width(const ipt_vocab* v) { return v->spec.befores + v->spec.room + v->spec.afters; }

int64_t ipt_encode(const ipt_vocab* v, const char* text, uint64_t n, char* lowered, int64_t* out) {
  const ipt_spec* p = &v->spec;
  if (n > IPT_MAX_TEXT) return -1; /* a text this long is Python's: no scratch of its size kept here */
  int blank = 1;
  for (uint64_t i = 0; i < n; ++i) {
    unsigned char c = (unsigned char)text[i];
    if (!is_read_here(c)) return -1;
    blank &= is_space(c);
  }
  if (blank) return -1; /* Python refuses it, saying why */
  for (uint64_t i = 0; i < n; ++i) {
    char c = text[i];
    lowered[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
  }
  for (const char* a = v->added; *a; a += strlen(a) + 1) { /* an added token's text, in any case */
    uint64_t size = strlen(a);
    for (uint64_t i = 0; i + size <= n; ++i) {
      if (memcmp(lowered + i, a, size) == 0) return -1;
    }
  }
  const char* read = p->lowercase ? lowered : text;
  int64_t count = 0;
  for (uint32_t k = 0; k < p->befores; ++k) out[count++] = p->before[k];
  int64_t room = p->befores + p->room;
  for (uint64_t i = 0; i < n && count < room;) {
    if (is_space((unsigned char)read[i])) {
      ++i;
      continue;
    }
    uint64_t end = i + 1;
    if (!is_punctuation((unsigned char)read[i])) {
      while (end < n && !is_space((unsigned char)read[end]) && !is_punctuation((unsigned char)read[end])) ++end;
    }
    word_pieces(v, read + i, end - i, out, &count, room);
    i = end;
  }
  for (uint32_t k = 0; k < p->afters; ++k) out[count++] = p->after[k];
  return count;
}

void ipt_vocab_free(ipt_vocab* v) {
  free(v->pool), free(v->table), free(v->added);
  v->pool = NULL, v->table = NULL, v->added = NULL;
}

int ipt_vocab_build(ipt_vocab* v, const ipt_spec* spec) {
  memset(v, 0, sizeof *v);
  v->spec = *spec;
  if (spec->count == 0 || spec->befores > IPT_MAX_SPECIAL || spec->afters > IPT_MAX_SPECIAL || spec->room < 1 ||
      spec->max_chars > IPT_MAX_CHARS || strlen(spec->prefix) >= sizeof v->prefix) {
    return 3;
  }
  uint64_t bytes = 0, size = 1;
  for (uint32_t w = 0; w < spec->count; ++w) {
    uint64_t end = (uint64_t)spec->offsets[w] + spec->lengths[w];
    bytes = end > bytes ? end : bytes;
  }
  while (size < 2ULL * spec->count) size <<= 1;
  size_t added = 1;
  for (const char* a = spec->added; *a; a += strlen(a) + 1) added += strlen(a) + 1;
  v->pool = malloc(bytes ? bytes : 1);
  v->table = malloc(size * sizeof *v->table);
  v->added = malloc(added);
  if (v->pool == NULL || v->table == NULL || v->added == NULL) return 1;
  memcpy(v->pool, spec->words, bytes);
  memcpy(v->added, spec->added, added);
  snprintf(v->prefix, sizeof v->prefix, "%s", spec->prefix);
  v->prefix_bytes = strlen(v->prefix);
  v->spec.words = NULL, v->spec.offsets = NULL, v->spec.lengths = NULL, v->spec.ids = NULL;
  v->spec.prefix = v->prefix, v->spec.added = v->added;
  v->mask = size - 1;
  for (uint64_t i = 0; i < size; ++i) v->table[i].id = -1;
  for (uint32_t w = 0; w < spec->count; ++w) {
    uint64_t hash = fnv(FNV_START, v->pool + spec->offsets[w], spec->lengths[w]);
    uint64_t at = hash & v->mask;
    while (v->table[at].id >= 0) at = (at + 1) & v->mask;
    v->table[at] = (ipt_entry){hash, spec->offsets[w], spec->lengths[w], spec->ids[w]};
    if (spec->lengths[w] > v->longest_word) v->longest_word = spec->lengths[w];
  }
  return 0;
}

int64_t ipt_encode_text(const ipt_spec* spec, const char* text, uint64_t n, int64_t* out) {
  ipt_vocab v;
  memset(&v, 0, sizeof v);
  char* lowered = malloc(n ? n : 1);
  int64_t got = lowered != NULL && ipt_vocab_build(&v, spec) == 0 ? ipt_encode(&v, text, n, lowered, out) : -2;
  ipt_vocab_free(&v);
  free(lowered);
  return got;
}
