"""The native tokenizer (triton_models/inprocess/native/bert_tokenize.c) against the tokenizers library: for every
text it reads
(printable ASCII, tab, newline, carriage return; not blank; no added token's text) the tokenize step's native path
must give exactly the ids tokenizer.encode gives, truncation included; every other text it must leave to Python."""

from __future__ import annotations

import numpy as np
import pytest

from tpserve.triton_models import NATIVE
from tpserve.triton_models.inprocess import native_tokenize
from tpserve.triton_models.runtime.tokenize_core import load_tokenizer

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def library(c_library):
    return c_library(NATIVE / "bert_tokenize.c", "bert_tokenize")


@pytest.fixture(scope="module")
def tokenizer_path():
    from tpserve.builders.spec.zoo.text import model_dir

    return str(model_dir() / "tokenizer.json")


def _read_natively(text: str) -> bool:
    printable = all(" " <= c <= "~" or c in "\t\n\r" for c in text)
    return (
        printable
        and bool(text.strip())
        and not any(t in text.lower() for t in ("[cls]", "[sep]", "[mask]", "[pad]", "[unk]"))
    )


def _texts(seed: int = 0) -> list[str]:
    from tpserve.builders.spec.zoo.text import SENTENCES

    rng = np.random.default_rng(seed)
    alphabet = (
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        + " " * 12
        + "\t\n\r"
        + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    )
    made = ["".join(rng.choice(list(alphabet), int(rng.integers(1, 120)))) for _ in range(300)]
    words = " ".join(SENTENCES).split()
    made += [" ".join(rng.choice(words, int(rng.integers(1, 80)))) for _ in range(200)]
    made += [
        "x" * 99 + " ok",
        "y" * 100,
        "z" * 101 + " fine",
        "Hello, World!! it's 3.14 o'clock...",
        " \tleading and trailing \n ",
    ]
    made += ["unaffable", "UNAFFABLE hyper-parameter tuning", "qqqqxqqqq zzzzjjj", "a" * 300]
    return list(SENTENCES) + made


@pytest.fixture(scope="module")
def cased_path(tokenizer_path, tmp_path_factory):
    """The same tokenizer, not lowercasing."""
    import json

    config = json.loads(open(tokenizer_path).read())
    config["normalizer"]["lowercase"] = False
    path = tmp_path_factory.mktemp("cased") / "tokenizer.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "max_length, cased, seed",
    [(256, False, 0), (64, False, 1), (16, False, 0), (8, False, 2), (256, True, 0), (32, True, 3), (16, True, 4)],
)
def test_every_text_read_natively_has_the_tokenizers_ids(library, tokenizer_path, cased_path, max_length, cased, seed):
    tokenizer_path = cased_path if cased else tokenizer_path
    cache = load_tokenizer(tokenizer_path, max_length)
    assert native_tokenize.why_not(cache, [("ids", "INT64"), ("mask", "INT64")], library_with_open(library)) is None
    reference = tokenizers.Tokenizer.from_file(tokenizer_path)
    reference.enable_truncation(max_length)
    reference.no_padding()
    encode, checked = native_tokenize.text_encoder(library, cache), 0
    for text in _texts(seed):
        got = encode(text.encode())
        if not _read_natively(text):
            assert got is None, text
            continue
        assert got == reference.encode(text).ids, text
        checked += 1
    assert checked > 400


def test_what_the_native_path_leaves_to_python(library, tokenizer_path):
    encode = native_tokenize.text_encoder(library, load_tokenizer(tokenizer_path, 256))
    for text in [
        "café au lait",
        "tab\x0bvertical",
        "nul\x00byte",
        "",
        "   ",
        "\t\n",
        "a [MASK] b",
        "x [cls] y",
        "del\x7f",
        "long " * 300_000,  # over a MiB: Python's
    ]:
        assert encode(text.encode()) is None, repr(text)


def library_with_open(library):
    """why_not asks for the backend's open function: the test library has the tokenizer alone."""

    class Both:
        ipt_open = None

    return Both()


def test_a_tokenizer_read_otherwise_keeps_the_python_path_and_says_why(tmp_path, tokenizer_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    bpe = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "[UNK]": 2}, merges=[], unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.save(str(tmp_path / "tokenizer.json"))
    outputs = [("ids", "INT64"), ("mask", "INT64")]
    reason = native_tokenize.why_not(
        load_tokenizer(str(tmp_path / "tokenizer.json"), 64), outputs, library_with_open(None)
    )
    assert reason is not None and "not BERT-style" in reason
    bert = load_tokenizer(tokenizer_path, 64)
    assert "no native tokenize path" in native_tokenize.why_not(bert, outputs, None)
    assert "INT64 or INT32" in native_tokenize.why_not(
        bert, [("ids", "FP32"), ("mask", "INT64")], library_with_open(None)
    )
    assert (
        native_tokenize.open_path(0, bert, outputs, library_with_open(None), wanted=False)
        == "parameter native_path is 0"
    )
