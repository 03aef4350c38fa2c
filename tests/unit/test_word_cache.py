"""The tokenize step's word cache (triton_models/runtime/word_cache.py) gives exactly the tokenizer's own ids: on plain
text, punctuation, long words, truncation, odd whitespace and control characters, and non-ASCII text (which it
hands to the tokenizer whole), with its cache full or not."""

import random

import pytest

from tpserve.triton_models.runtime.word_cache import WordCache, bert_style

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer():
    from tpserve.builders.spec.zoo.text import model_dir

    found = tokenizers.Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    found.enable_truncation(32)
    found.no_padding()
    return found


def hostile_texts(seed: int = 0, count: int = 400) -> list[str]:
    rng = random.Random(seed)
    pieces = [
        "Hello",
        "WORLD",
        "don't",
        "e-mail",
        "U.S.A.",
        "3.14",
        "$5",
        "(x)",
        "a" * 120,
        "!!!",
        "naïve",
        "日本語",
        "Ünïcödé",
        "tab\there",
        "line\nbreak",
        "cr\r",
        "nul\x00",
        "bell\x07",
        "vt\x0b",
        "ff\x0c",
        "fs\x1c",
        "del\x7f",
        "nbsp\xa0x",
        "zw\u200bx",
        "emoji😀",
        "##ing",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "  ",
        "x",
        "model",
        "serves",
    ]
    return [" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(count)]


def test_the_cache_gives_the_tokenizers_own_ids(tokenizer):
    assert bert_style(tokenizer)
    cache = WordCache(tokenizer, 32)
    texts = hostile_texts()
    expected = [e.ids for e in tokenizer.encode_batch(texts)]
    assert cache.ids(texts) == expected  # learning
    assert cache.ids(texts) == expected  # from the cache
    assert len(cache.index) > 1


def test_a_few_texts_read_word_by_word_give_the_same_ids_as_a_batch(tokenizer):
    texts = hostile_texts(seed=3, count=120)
    expected = [e.ids for e in tokenizer.encode_batch(texts)]
    for max_words in (1 << 17, 12):  # roomy, and so small that the cache starts over for most texts
        cache = WordCache(tokenizer, 32, max_words=max_words)
        for start in range(0, len(texts), 3):  # three texts a call: the few-texts path, cold then warm
            group = texts[start : start + 3]
            assert cache.ids(group) == expected[start : start + 3]
            assert cache.ids(group) == expected[start : start + 3]
        assert cache.ids(texts) == expected  # the batch path after it


def test_a_full_cache_starts_over_and_stays_exact(tokenizer):
    cache = WordCache(tokenizer, 32, max_words=10)
    for seed in range(3):
        rng = random.Random(seed)
        texts = [
            " ".join(rng.choice(["Model", "serves", "fast,", "e-mail", "3.14", "x" * 120]) + str(n) for n in range(30))
        ]
        assert cache.ids(texts) == [e.ids for e in tokenizer.encode_batch(texts)]
        words = {w for t in texts for w in t.lower().split()}
        assert len(words) > 10 and len(cache.index) == 1 + len(words)  # over the cap: only this batch's words


def test_a_tokenizer_that_is_not_bert_style_is_read_whole():
    from tokenizers import Tokenizer, models, pre_tokenizers

    other = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    cache = WordCache(other, 16)
    assert not cache.enabled
    assert cache.ids(["a b c", "b"]) == [[1, 2, 0], [2]]


def test_random_printable_ascii_matches_at_both_truncations(tokenizer):
    import string

    rng = random.Random(7)
    alphabet = string.printable  # letters, digits, punctuation and all of ASCII's whitespace (\x0b, \x0c too)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400))) for _ in range(300)]
    long = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    long.enable_truncation(256)
    for reference, length in ((tokenizer, 32), (long, 256)):
        assert WordCache(reference, length).ids(texts) == [e.ids for e in reference.encode_batch(texts)]


def test_the_ids_cap_starts_the_cache_over_too(tokenizer):
    cache = WordCache(tokenizer, 32, max_ids=20)
    texts = ["!" * 40 + " one"]  # a chunk of 40 ids (cut to 32) fills the pool past its cap
    assert cache.ids(texts) == [tokenizer.encode(texts[0]).ids] and len(cache.pool) > 20
    assert cache.ids(["four five"]) == [tokenizer.encode("four five").ids] and len(cache.index) == 3
    batch = ["!" * 40 + " one", *(f"word{n} two" for n in range(8))]  # the batch path: one batch learned together
    assert cache.ids(batch) == [e.ids for e in tokenizer.encode_batch(batch)] and len(cache.pool) > 20


def test_a_cased_tokenizer_keeps_case_and_still_reads_added_tokens_whole(tokenizer):
    import json

    config = json.loads(tokenizer.to_str())
    config["normalizer"]["lowercase"] = False
    cased = tokenizers.Tokenizer.from_str(json.dumps(config))
    cache = WordCache(cased, 32)
    assert cache.enabled and not cache.lowercase
    texts = ["Hello hello HELLO", "a [CLS] b", "x [cls] y", "Model, serves."]
    assert cache.ids(texts) == [e.ids for e in cased.encode_batch(texts)]
