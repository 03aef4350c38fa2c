"""The tokenize step's work, shared by its two faces (the Python-backend model.py, text_tokenize.py, and the
in-process backend, tokenize_serving.py): texts decoded per request, one Rust `encode_batch` over every text of
a dynamic batch (the tokenizer spreads it over its threads), each request's rows cut to its own longest text.
A request with a bad text (empty, whitespace only, not UTF-8) is refused alone, naming the text.
"""

from __future__ import annotations

import itertools
import os
import struct

import numpy as np

from tpserve.triton_models.runtime.word_cache import WordCache

STEP = "tokenize"


def load_tokenizer(path: str, max_length: int) -> WordCache:
    """tokenizer.json, truncating to max_length, never padding: encode pads each request to its own longest
    text in numpy (padding in the tokenizer pads every text of a batch to the batch's longest, as Python lists).
    Read through a WordCache (triton_models/runtime/word_cache.py): a BERT-style tokenizer's words are tokenized
    once."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    return WordCache(tokenizer, max_length)


def tokenize(tokenizer, texts: list) -> list:
    """Per request (an array of bytes or str), (ids, mask) int64 [texts, longest] or a ValueError saying why it
    is refused."""
    decoded, errors = decode_requests(texts)
    good = [i for i, e in enumerate(errors) if e is None]
    results: list = [ValueError(f"{STEP}: {e}") if e is not None else None for e in errors]
    for i, arrays in zip(good, encode(tokenizer, [decoded[i] for i in good])):
        results[i] = arrays
    return results


def encode(tokenizer: WordCache, per_request: list) -> list:
    """Every request's texts tokenized together; each request's rows padded to its own longest text."""
    if not per_request:
        return []
    lengths, flat = tokenizer.encode(list(itertools.chain.from_iterable(per_request)))
    out, start, at = [], 0, 0
    for texts in per_request:
        mine = lengths[start : start + len(texts)]
        width, real = max(int(mine.max()), 1), int(mine.sum())
        if len(texts) == 1:  # a lone text: its ids as they are (no padding to work out)
            rows = flat[at : at + real].reshape(1, real)
            out.append((rows, np.ones_like(rows)))
        else:
            mask = (np.arange(width)[None, :] < mine[:, None]).astype(np.int64)
            rows = np.zeros(mask.shape, np.int64)
            rows[mask.astype(bool)] = flat[at : at + real]  # row-major: each text's ids, then zeros
            out.append((rows, mask))
        start, at = start + len(texts), at + real
    return out


def decode_requests(texts: list) -> tuple[list, list]:
    """Per request, its texts as a list of str, or why the request is refused. Python's own bytes.decode: numpy's
    char functions cost about 8 µs a text, a serial step in front of the tokenizer's threads."""
    decoded: list = []
    errors: list = []
    for request in texts:
        try:
            mine = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in request.tolist()]
        except UnicodeDecodeError:  # the slow path only for a bad request: say which text
            decoded.append([])
            errors.append(_undecodable(request))
            continue
        decoded.append(mine)
        errors.append(_empty(mine))
    return decoded, errors


def _undecodable(request) -> str:
    for index, raw in enumerate(request.tolist()):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"text {index} is not valid UTF-8 ({err})"
    return "a text is not valid UTF-8"


def _empty(texts: list):
    """Why a request's texts are refused (an empty or whitespace-only one), or None."""
    if not texts:
        return "the request holds no text"
    blank = next((i for i, t in enumerate(texts) if not t or t.isspace()), None)
    return f"text {blank} is empty or whitespace only" if blank is not None else None


def parse_bytes(raw: bytes, count: int) -> np.ndarray:
    """Triton's BYTES tensor (each element a little-endian uint32 length, then its bytes) -> object array.

    Raises:
        ValueError: the buffer does not hold exactly `count` elements.
    """
    out, at, view = np.empty(count, object), 0, memoryview(raw)
    for index in range(count):
        if at + 4 > len(view):
            raise ValueError(f"{STEP}: TEXT holds {index} of {count} elements")
        (size,) = struct.unpack_from("<I", view, at)
        if at + 4 + size > len(view):
            raise ValueError(f"{STEP}: text {index} claims {size} bytes, {len(view) - at - 4} remain")
        out[index] = bytes(view[at + 4 : at + 4 + size])
        at += 4 + size
    if at != len(view):
        raise ValueError(f"{STEP}: TEXT has {len(view) - at} bytes after its {count} elements")
    return out
