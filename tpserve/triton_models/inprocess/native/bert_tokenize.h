/* A BERT-style tokenizer read natively for texts of printable ASCII (bert_tokenize.c): what the tokenize step's
 * native path (tokenize_path.c) tokenizes with. A unit test holds it to the tokenizers library. */
#ifndef BERT_TOKENIZE_H
#define BERT_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

enum { IPT_NAME = 64, IPT_MAX_SPECIAL = 8, IPT_MAX_CHARS = 256, IPT_MAX_TEXT = 1 << 20 };

/* What Python hands over (triton_models/inprocess/native_tokenize.py's TokenizeSpec; copied: Python's memory may go). */
typedef struct {
  const char* words; /* the vocabulary's words, one after the other */
  const uint32_t* offsets;
  const uint32_t* lengths;
  const int64_t* ids;
  uint32_t count;
  const char* prefix; /* continuing_subword_prefix, "##" */
  int64_t unk_id;
  uint32_t max_chars; /* max_input_chars_per_word */
  int lowercase;
  int64_t before[IPT_MAX_SPECIAL], after[IPT_MAX_SPECIAL];
  uint32_t befores, afters;
  int64_t room;      /* a text's own ids kept: max_length less the special tokens */
  const char* added; /* added tokens' texts, lowercased, each ended by a NUL, then an empty one */
  char input_name[IPT_NAME];
  char output_names[2][IPT_NAME]; /* ids, then mask */
  int output_dtypes[2];
} ipt_spec;

typedef struct {
  uint64_t hash;
  uint32_t offset, length;
  int64_t id; /* -1: an empty entry */
} ipt_entry;

/* The vocabulary as a hash table, and the spec's settings (its pointers into Python's memory cleared). */
typedef struct {
  ipt_spec spec;
  char* pool;
  ipt_entry* table;
  uint64_t mask;
  uint32_t longest_word;
  char* added;
  char prefix[17];
  uint64_t prefix_bytes;
} ipt_vocab;

/* 0: built; 1: out of memory; 3: settings not read natively. ipt_vocab_free frees what was built either way. */
int ipt_vocab_build(ipt_vocab* v, const ipt_spec* spec);
void ipt_vocab_free(ipt_vocab* v);
/* The most ids a text takes (its own kept ids and the special tokens). */
int64_t ipt_width(const ipt_vocab* v);
/* A text's ids (the special tokens around its own) into out (ipt_width of room); lowered: n bytes of scratch.
 * Returns the count, or -1: the text is not read here (a byte outside printable ASCII, tab, newline and carriage
 * return; blank; an added token's text in it; over IPT_MAX_TEXT bytes). */
int64_t ipt_encode(const ipt_vocab* v, const char* text, uint64_t n, char* lowered, int64_t* out);
/* ipt_encode with a vocabulary built for the one text (the tests' view); -2: out of memory or settings refused. */
int64_t ipt_encode_text(const ipt_spec* spec, const char* text, uint64_t n, int64_t* out);

#endif
