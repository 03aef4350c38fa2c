"""Token ids of whole words, remembered: the tokenize step's fast path for BERT-style tokenizers.

A BERT tokenizer (BertNormalizer, BertPreTokenizer, WordPiece) reads each whitespace-separated chunk of a text on
its own: the normalizer works character by character, the pre-tokenizer splits at whitespace first, and
WordPiece reads one word at a time. So a text's ids are its chunks' ids, one after the other, between the
special tokens. Traffic repeats its words, so each chunk is tokenized once (every new chunk of a batch in one
`encode_batch_fast`, over the tokenizer's threads) and looked up afterwards: a dict lookup a word instead of
the Rust normalizer and pre-tokenizer a text.

This holds exactly only where Python and the tokenizer agree on what whitespace and characters are: printable
ASCII plus tab, newline and carriage return, and where no added token ([CLS], [MASK]: matched in the raw text,
before any split) appears. Any other text (non-ASCII, other control characters, an added token's text) goes
through the tokenizer whole, and so does every text of a tokenizer that is not BERT-style. The cache is bounded
(max_words chunks, max_ids ids): full, it starts over.
"""

from __future__ import annotations

import itertools
import json

import numpy as np


def bert_style(tokenizer) -> bool:
    """Whether tokenizer reads chunk by chunk as described above (lowercasing or not)."""
    config = json.loads(tokenizer.to_str())
    normalizer, pre = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}
    return (
        normalizer.get("type") == "BertNormalizer"
        and normalizer.get("clean_text", True)
        and pre.get("type") == "BertPreTokenizer"
        and (config.get("model") or {}).get("type") == "WordPiece"
    )


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's own ([CLS] and [SEP] for BERT)."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    whole = tokenizer.encode("a").ids
    for start in range(len(whole) - len(bare) + 1):
        if whole[start : start + len(bare)] == bare:
            return whole[:start], whole[start + len(bare) :]
    raise ValueError("the tokenizer's special tokens could not be told apart from a text's own")


SEPARATOR = " \x00 "  # between a batch's texts, joined: a word of its own, never in a text read here (NUL is not)
# printable ASCII + \t\n\r: outside these the tokenizer removes or splits on characters where Python would not
PRINTABLE = bytes(range(0x20, 0x7F)) + b"\t\n\r"


class WordCache:
    """Per text, its token ids with the special tokens, truncated to max_length: as tokenizer.encode gives them.

    Known words sit in one array (pool); each has its start and size there. A batch is read in a few passes over
    all its words at once: the texts joined (SEPARATOR between), lowercased and split once, each word looked up,
    the ids gathered with numpy.
    """

    def __init__(self, tokenizer, max_length: int, max_words: int = 1 << 17, max_ids: int = 1 << 22):
        self.tokenizer, self.max_words, self.max_ids = tokenizer, max_words, max_ids  # max_ids: 32 MiB of ids
        self.enabled = bert_style(tokenizer)
        self.before, self.after = special_tokens(tokenizer)
        self.room = max_length - len(self.before) - len(self.after)  # a text's own ids past this are cut
        config = json.loads(tokenizer.to_str())
        self.lowercase = self.enabled and config["normalizer"].get("lowercase", True)
        # added tokens' texts ([CLS], [MASK]...): the tokenizer matches them in the raw text, before it splits
        self.added = [t["content"].lower() for t in config.get("added_tokens") or []]
        self._forget()

    FEW = 4  # texts a batch up to which each is read word by word in Python (numpy's passes cost more for so few)

    def _forget(self) -> None:
        self.index: dict[str, int] = {SEPARATOR.strip(): 0}  # word -> its number; 0: between texts (no ids)
        self.start, self.size = [0], [0]
        self.word_ids: list[tuple] = [()]  # by number: the word's ids, for the few-texts path
        self.pool = np.zeros(0, np.int64)
        self._arrays = None

    def ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, as lists."""
        lengths, flat = self.encode(texts)
        return [a.tolist() for a in np.split(flat, np.cumsum(lengths)[:-1])] if len(texts) else []

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(each text's number of ids, all the ids one text after the other), int64."""
        if not texts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if not self.enabled:
            return _flatten([e.ids for e in self.tokenizer.encode_batch_fast(texts)])
        joined, lowered = self._joined(texts)
        if self._exact(joined, lowered, len(texts)):
            if len(texts) <= self.FEW:
                return self._few(lowered.split(SEPARATOR))  # each text as lowered once (no NUL in any: _exact)
            return self._cached(lowered, len(texts))
        exact = [self._exact(t, t.lower() if self.lowercase else t, 1) for t in texts]  # text by text
        out: list = [None] * len(texts)
        mine = [i for i, ok in enumerate(exact) if ok]
        if mine:
            lengths, flat = self._cached(self._joined([texts[i] for i in mine])[1], len(mine))
            for i, row in zip(mine, np.split(flat, np.cumsum(lengths)[:-1])):
                out[i] = row
        others = [i for i, ok in enumerate(exact) if not ok]
        for i, e in zip(others, self.tokenizer.encode_batch_fast([texts[i] for i in others])):
            out[i] = e.ids
        return _flatten(out)

    def _joined(self, texts: list[str]) -> tuple[str, str]:
        """The texts joined (SEPARATOR between), and that lowercased where the tokenizer lowercases."""
        joined = SEPARATOR.join(texts)
        return joined, joined.lower() if self.lowercase else joined

    def _exact(self, joined: str, lowered: str, count: int) -> bool:
        """Whether every one of count texts, joined, can be read from the cache: printable ASCII only (the
        separators' NULs aside) and no added token's text, in any case (a pass or two over the joined texts)."""
        if not joined.isascii():
            return False
        rest = joined.encode("ascii").translate(None, PRINTABLE)
        if len(rest) != count - 1:  # only the separators' NULs may remain
            return False
        haystack = lowered if self.lowercase else lowered.lower()  # added tokens are found in any case
        return not any(token in haystack for token in self.added)

    def _cached(self, lowered: str, count: int) -> tuple[np.ndarray, np.ndarray]:
        """lowered: the batch's texts joined, lowercased where the tokenizer lowercases."""
        words = lowered.split()
        try:
            number = np.fromiter(map(self.index.__getitem__, words), np.int64, len(words))
        except KeyError:  # new words: learn them all, then look again
            self._learn(words)
            number = np.fromiter(map(self.index.__getitem__, words), np.int64, len(words))
        start, size = self._tables()
        text = np.cumsum(number == 0)  # each word's text (a separator opens the next)
        sizes = size[number]
        own = np.bincount(text, weights=sizes, minlength=count).astype(np.int64)
        total = int(sizes.sum())
        token_word = np.repeat(np.arange(len(words)), sizes)
        at = np.arange(total)
        ids = self.pool[start[number][token_word] + at - (np.cumsum(sizes) - sizes)[token_word]]
        token_text = text[token_word]
        place = at - (np.cumsum(own) - own)[token_text]  # a token's place in its text's own ids
        keep = place < self.room
        kept = np.minimum(own, self.room)
        head, tail = len(self.before), len(self.after)
        lengths = kept + head + tail
        first = np.cumsum(lengths) - lengths
        flat = np.empty(int(lengths.sum()), np.int64)
        for j, token in enumerate(self.before):
            flat[first + j] = token
        for j, token in enumerate(self.after):
            flat[first + head + kept + j] = token
        flat[first[token_text[keep]] + head + place[keep]] = ids[keep]
        return lengths, flat

    def _few(self, lowered: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """_cached's result for a few texts, each read in plain Python: a lone request's text costs a few
        microseconds instead of numpy's twenty-odd calls."""
        lengths, flat = [], []
        for text in lowered:
            words = text.split()
            if not all(word in self.index for word in words):
                self._learn(words)  # every word of this text known after (the cache may start over for it)
            own = list(itertools.chain.from_iterable(self.word_ids[self.index[word]] for word in words))
            row = [*self.before, *own[: self.room], *self.after]
            lengths.append(len(row))
            flat.extend(row)
        return np.array(lengths, np.int64), np.array(flat, np.int64)

    def _tables(self):
        if self._arrays is None:
            self._arrays = (np.asarray(self.start, np.int64), np.asarray(self.size, np.int64))
        return self._arrays

    def _learn(self, words: list[str]) -> None:
        """Every one of words known (new ones tokenized together). Full (max_words words or max_ids ids), it starts
        over: one batch's words are the most it holds past its caps."""
        new = list(set(words).difference(self.index))
        if not new:
            return
        if len(self.index) + len(new) > self.max_words or len(self.pool) >= self.max_ids:
            self._forget()
            new = list(set(words).difference(self.index))
        found = [e.ids for e in self.tokenizer.encode_batch_fast(new, add_special_tokens=False)]
        at = len(self.pool)
        for word, ids in zip(new, found):
            self.index[word] = len(self.start)
            self.start.append(at)
            self.size.append(len(ids))
            self.word_ids.append(tuple(ids))
            at += len(ids)
        added = np.fromiter(itertools.chain.from_iterable(found), np.int64, at - len(self.pool))
        self.pool = np.concatenate([self.pool, added])
        self._arrays = None


def _flatten(rows: list) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    flat = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(lengths.sum()))
    return lengths, flat
