"""The tokenize step's work (triton_models/runtime/tokenize_core.py): one encode_batch per batch, each request padded to
its own longest text exactly as the tokenizer pads, bad requests refused alone, Triton's BYTES layout parsed."""

import struct

import numpy as np
import pytest

from tpserve.triton_models.runtime import tokenize_core as core

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer_path():
    from tpserve.builders.spec.zoo.text import model_dir

    return str(model_dir() / "tokenizer.json")


def test_requests_match_the_tokenizers_own_padding(tokenizer_path):
    from tpserve.builders.spec.zoo.text import SENTENCES

    reference = tokenizers.Tokenizer.from_file(tokenizer_path)
    reference.enable_truncation(256)
    reference.enable_padding()
    requests = [np.array([s.encode() for s in SENTENCES[i : i + 7]], dtype=object) for i in range(0, len(SENTENCES), 7)]
    for request, (ids, mask) in zip(requests, core.tokenize(core.load_tokenizer(tokenizer_path, 256), requests)):
        expected = reference.encode_batch([t.decode() for t in request])
        width = max(sum(e.attention_mask) for e in expected)
        assert ids.shape == mask.shape == (len(request), width) and ids.dtype == mask.dtype == np.int64
        np.testing.assert_array_equal(ids, np.array([e.ids for e in expected])[:, :width])
        np.testing.assert_array_equal(mask, np.array([e.attention_mask for e in expected])[:, :width])


def test_a_bad_request_is_refused_alone_naming_its_text(tokenizer_path):
    tokenizer = core.load_tokenizer(tokenizer_path, 64)
    good = np.array([b"hello there", b"general kenobi"], dtype=object)
    results = core.tokenize(
        tokenizer, [good, np.array([b"ok", b"   "], dtype=object), np.array([b"\xff\xfe"], dtype=object), good]
    )
    assert isinstance(results[1], ValueError) and "text 1 is empty or whitespace only" in str(results[1])
    assert isinstance(results[2], ValueError) and "text 0 is not valid UTF-8" in str(results[2])
    np.testing.assert_array_equal(results[0][0], results[3][0])


def test_bytes_tensors_parse_as_triton_lays_them_out():
    items = [b"a", b"", "é".encode()]
    raw = b"".join(struct.pack("<I", len(x)) + x for x in items)
    assert core.parse_bytes(raw, 3).tolist() == items
    for bad, count, words in ((raw, 4, "holds 3 of 4"), (raw + b"x", 3, "after its 3"), (raw[:-1], 3, "claims")):
        with pytest.raises(ValueError, match=words):
            core.parse_bytes(bad, count)
