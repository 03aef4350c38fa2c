"""The tokenize step's native path (tokenize_path.c): what Python hands it when an instance starts.

A BERT-style tokenizer (the WordCache's test: BertNormalizer with clean_text, BertPreTokenizer, WordPiece) is read
natively for texts of printable ASCII: the vocabulary, WordPiece's prefix, [UNK] and the longest word it reads,
the special tokens around a text, how many of a text's own ids are kept, and the added tokens' texts (a text that
holds one goes to Python). Any other tokenizer keeps the Python path, and the load says why.
"""

from __future__ import annotations

import ctypes
import json
from ctypes import POINTER, c_char, c_char_p, c_int, c_int64, c_uint32, c_uint64

import numpy as np

MAX_SPECIAL = 8
MAX_CHARS = 256
DTYPES = {"INT32": 8, "INT64": 9}
COUNTS = ("batches", "requests", "texts", "python_batches")


class TokenizeSpec(ctypes.Structure):
    """ipt_spec, field for field."""

    _fields_ = [
        ("words", c_char_p),
        ("offsets", POINTER(c_uint32)),
        ("lengths", POINTER(c_uint32)),
        ("ids", POINTER(c_int64)),
        ("count", c_uint32),
        ("prefix", c_char_p),
        ("unk_id", c_int64),
        ("max_chars", c_uint32),
        ("lowercase", c_int),
        ("before", c_int64 * MAX_SPECIAL),
        ("after", c_int64 * MAX_SPECIAL),
        ("befores", c_uint32),
        ("afters", c_uint32),
        ("room", c_int64),
        ("added", c_char_p),
        ("input_name", c_char * 64),
        ("output_names", (c_char * 64) * 2),
        ("output_dtypes", c_int * 2),
    ]


def why_not(cache, outputs: list[tuple[str, str]], library) -> str | None:
    """Why the tokenize step cannot take the native path, or None. cache: the step's WordCache."""
    if library is None or not hasattr(library, "ipt_open"):
        return "the backend's library has no native tokenize path"
    if not cache.enabled:
        return "the tokenizer is not BERT-style (BertNormalizer, BertPreTokenizer, WordPiece)"
    model = json.loads(cache.tokenizer.to_str())["model"]
    if model.get("unk_token") not in model.get("vocab", {}):
        return f"WordPiece's unk_token {model.get('unk_token')!r} is not in its vocabulary"
    if int(model.get("max_input_chars_per_word", 100)) > MAX_CHARS:
        return f"max_input_chars_per_word is over {MAX_CHARS}"
    if len(model.get("continuing_subword_prefix", "##").encode()) > 16:
        return "continuing_subword_prefix is longer than 16 bytes"
    if len(cache.before) > MAX_SPECIAL or len(cache.after) > MAX_SPECIAL:
        return f"more than {MAX_SPECIAL} special tokens around a text"
    if cache.room < 1:
        return "max_length leaves no room for a text's own ids"
    if len(outputs) != 2 or any(dtype not in DTYPES for _, dtype in outputs):
        return f"outputs {outputs}: expected ids and mask, INT64 or INT32"
    return None


def spec_for(cache, outputs: list[tuple[str, str]]) -> tuple[TokenizeSpec, list]:
    """The spec, and the Python objects it points into (kept alive until ipt_open has copied them)."""
    model = json.loads(cache.tokenizer.to_str())["model"]
    vocab = model["vocab"]
    words = [w.encode() for w in vocab]
    lengths = np.array([len(w) for w in words], np.uint32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint32)
    ids = np.array(list(vocab.values()), np.int64)
    pool = b"".join(words)
    added = b"".join(text.encode() + b"\0" for text in cache.added if text) + b"\0"
    spec = TokenizeSpec()
    spec.words, spec.count = pool, len(words)
    spec.offsets = offsets.ctypes.data_as(POINTER(c_uint32))
    spec.lengths = lengths.ctypes.data_as(POINTER(c_uint32))
    spec.ids = ids.ctypes.data_as(POINTER(c_int64))
    spec.prefix = model.get("continuing_subword_prefix", "##").encode()
    spec.unk_id = vocab[model["unk_token"]]
    spec.max_chars = int(model.get("max_input_chars_per_word", 100))
    spec.lowercase = int(bool(cache.lowercase))
    spec.befores, spec.afters = len(cache.before), len(cache.after)
    for k, value in enumerate(cache.before):
        spec.before[k] = value
    for k, value in enumerate(cache.after):
        spec.after[k] = value
    spec.room, spec.added, spec.input_name = cache.room, added, b"TEXT"
    for k, (name, dtype) in enumerate(outputs):
        spec.output_names[k].value, spec.output_dtypes[k] = name.encode(), DTYPES[dtype]
    return spec, [pool, offsets, lengths, ids, added]


def open_path(handle: int, cache, outputs: list[tuple[str, str]], library, wanted: bool = True) -> str | None:
    """Opens the instance's native tokenize path; None when it is open, else why not."""
    if not wanted:
        return "parameter native_path is 0"
    reason = why_not(cache, outputs, library)
    if reason is not None:
        return reason
    spec, _kept = spec_for(cache, outputs)
    library.ipt_open.argtypes, library.ipt_open.restype = (ctypes.c_void_p, POINTER(TokenizeSpec)), c_int
    code = library.ipt_open(handle, ctypes.byref(spec))
    reasons = {
        1: "out of memory",
        2: "no room for another instance",
        3: "the tokenizer's settings are not read natively",
    }
    return None if code == 0 else reasons.get(code, f"ipt_open returned {code}")


def counts(handle: int, library, close: bool = False) -> dict[str, int]:
    """What the native path served: batches, requests, texts, and batches it handed to Python."""
    found = (c_uint64 * len(COUNTS))()
    function = library.ipt_close if close else library.ipt_counts
    function.argtypes, function.restype = (ctypes.c_void_p, POINTER(c_uint64 * len(COUNTS))), None
    function(handle, ctypes.byref(found))
    return dict(zip(COUNTS, found))


def text_encoder(library, cache, outputs=(("ids", "INT64"), ("mask", "INT64"))):
    """A function of one text (bytes): its ids as the native path reads them, or None where it is left to Python
    (the tests' view of bert_tokenize.c)."""
    spec, kept = spec_for(cache, list(outputs))
    width = cache.room + len(cache.before) + len(cache.after)
    function = library.ipt_encode_text
    function.argtypes = (POINTER(TokenizeSpec), c_char_p, c_uint64, POINTER(c_int64))
    function.restype = c_int64

    def encode(text: bytes, kept=kept) -> list[int] | None:
        out = (c_int64 * width)()
        got = function(ctypes.byref(spec), text, len(text), out)
        if got == -2:
            raise MemoryError("ipt_encode_text: out of memory or a spec it does not read")
        return None if got < 0 else list(out[:got])

    return encode
