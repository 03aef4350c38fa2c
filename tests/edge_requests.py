"""Hypothesis strategies for HTTP inference requests that two JSON readers could read differently.

A request is built as a tree, then written out with the variations that split parsers: duplicate keys,
escaped keys and strings, numbers in other spellings (1.0, 1e0, 01, -0, 0x1), NaN and Infinity in data,
nested data, odd whitespace, many parameters, unknown keys, trailing text, and the binary form's
Inference-Header-Content-Length in other spellings. The differential test (tests/functional/
test_edge_differential.py, `make fuzz-edge`) sends them through the edge to a real tritonserver.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

from hypothesis import strategies as st

SPACE = st.sampled_from(["", "", "", " ", "\n", "\t", "  \r\n"])
NUMBER_FORMS = ["plain", "plain", "plain", "plain", "fraction", "exponent", "leading_zero", "minus_zero", "plus", "hex"]


@dataclass(frozen=True)
class Request:
    """A rendered request: path, headers, body, and what was meant (for the report)."""

    path: str
    headers: dict
    body: bytes
    meant: str


def number_text(value: int, form: str) -> str:
    """value written in one of NUMBER_FORMS (some are not JSON, some are JSON that means a double)."""
    return {
        "plain": str(value),
        "fraction": f"{value}.0",
        "exponent": f"{value}e0",
        "leading_zero": f"0{value}",
        "minus_zero": "-0" if value == 0 else str(value),
        "plus": f"+{value}",
        "hex": hex(value),
    }[form]


def escaped(text: str, draw) -> str:
    """text as a JSON string body, each character plain or \\u-escaped (draw decides)."""
    out = []
    for char in text:
        if char in '"\\' or ord(char) < 0x20:
            out.append(json.dumps(char)[1:-1])
        elif draw(st.integers(0, 9)) == 0:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@st.composite
def key(draw, name: str) -> str:
    """A key, usually plain, sometimes with an escaped character (refused by the edge: Triton decodes it)."""
    if draw(st.integers(0, 30)) == 0:
        return escaped(name, lambda s: 0) if len(name) == 0 else '"' + name[:-1] + f"\\u{ord(name[-1]):04x}" + '"'
    return json.dumps(name)


def write_object(pairs: list[tuple[str, str]], draw) -> str:
    space = draw(SPACE)
    return "{" + space + ("," + draw(SPACE)).join(f"{k}{draw(SPACE)}:{draw(SPACE)}{v}" for k, v in pairs) + space + "}"


@st.composite
def shape_dims(draw) -> list[int]:
    small = st.integers(0, 4)
    large = st.sampled_from([2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**63])
    return draw(st.lists(st.one_of(small, small, small, large), min_size=0, max_size=3))


@st.composite
def data_text(draw, datatype: str, count: int, dims: list[int]) -> str:
    """JSON data of count values (nested as dims when they fit), with odd spellings at times."""
    if datatype == "BYTES":
        values = [escaped(draw(st.text(max_size=6)), draw) for _ in range(count)]
    else:
        special = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0", "0.5", "1E+2", ".5", "01", "1."])
        plain = st.integers(-9, 9).map(str)
        values = [draw(special) if draw(st.integers(0, 40)) == 0 else draw(plain) for _ in range(count)]
    nest = len(dims) == 2 and dims[0] * dims[1] == count and dims[0] > 0 and draw(st.booleans())
    if nest:
        rows = [values[i * dims[1] : (i + 1) * dims[1]] for i in range(dims[0])]
        return "[" + ",".join("[" + ",".join(r) + "]" for r in rows) + "]"
    return "[" + ("," + draw(SPACE)).join(values) + "]"


@st.composite
def input_object(draw, binary: list) -> str:
    """One input object; binary collects the bytes of inputs sent in the binary part."""
    name = draw(st.sampled_from(["A"] * 6 + ["B"] * 5 + ["C"]))
    datatype = draw(st.sampled_from(["FP32", "FP32", "BYTES", "BYTES", "INT64", "FP16"]))
    if draw(st.integers(0, 9)) > 0:  # usually the datatype the echo model declares
        datatype = {"A": "FP32", "B": "BYTES"}.get(name, datatype)
    dims = (
        draw(shape_dims())
        if draw(st.integers(0, 9)) == 0
        else [draw(st.integers(1, 3)) for _ in range(2 if name == "A" else 1)]
    )
    forms = [draw(st.sampled_from(NUMBER_FORMS)) if draw(st.integers(0, 12)) == 0 else "plain" for _ in dims]
    shape = "[" + ",".join(number_text(d, f) for d, f in zip(dims, forms)) + "]"
    count = math.prod(dims) if all(d < 64 for d in dims) else draw(st.integers(0, 4))
    count = max(0, count + (draw(st.sampled_from([-1, 1])) if draw(st.integers(0, 12)) == 0 else 0))
    pairs = [(draw(key("name")), escaped(name, draw)), (draw(key("datatype")), json.dumps(datatype))]
    pairs.append((draw(key("shape")), shape))
    if draw(st.integers(0, 3)) == 0:  # binary data
        content = _binary(datatype, count, draw)
        binary.append(content)
        pairs.append(('"parameters"', write_object([('"binary_data_size"', str(len(content)))], draw)))
    else:
        pairs.append((draw(key("data")), draw(data_text(datatype, count, dims))))
    return write_object(_varied(pairs, draw), draw)


def _binary(datatype: str, count: int, draw) -> bytes:
    """count elements of datatype as Triton's binary form (BYTES: length-prefixed), sometimes 4 bytes off."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", 2) + b"ab" for _ in range(count))
    size = {"FP32": 4, "INT64": 8, "FP16": 2}[datatype] * count
    return b"\0" * max(0, size + (draw(st.sampled_from([-4, 4])) if draw(st.integers(0, 12)) == 0 else 0))


def _varied(pairs: list[tuple[str, str]], draw) -> list[tuple[str, str]]:
    """pairs shuffled, sometimes with a key repeated (another value) or an unknown key or parameters."""
    pairs = draw(st.permutations(pairs))
    roll = draw(st.integers(0, 23))
    if roll == 0 and pairs:
        k, _ = draw(st.sampled_from(pairs))
        pairs = [*pairs, (k, draw(st.sampled_from(["[1,1]", '"FP32"', '"A"', "[2147483648]", "[]"])))]
    elif roll == 1:
        pairs = [*pairs, ('"extra"', "1")]
    elif roll == 2:
        n = draw(st.sampled_from([1, 8, 64, 65, 300]))
        pairs = [*pairs, ('"parameters"', "{" + ",".join(f'"p{i}":{i}' for i in range(n)) + "}")]
    elif roll == 3:  # the call id's name: the server's own in the request's parameters, a tensor's own in an input's
        name = draw(st.sampled_from(["x-edge-call", "X-Edge-Call", "x-edge-calls"]))
        pairs = [*pairs, ('"parameters"', f'{{"{name}":"00000000000000ab"}}')]
    return pairs


@st.composite
def infer_request(draw, model: str = "echo") -> Request:
    """A rendered POST .../infer to model through the edge."""
    binary: list[bytes] = []
    inputs = [draw(input_object(binary)) for _ in range(draw(st.integers(1, 2)))]
    pairs = [(draw(key("inputs")), "[" + ",".join(inputs) + "]")]
    if draw(st.integers(0, 5)) == 0:
        pairs.append(('"outputs"', '[{"name":"READ"}]'))
    head = (
        draw(SPACE)
        + write_object(_varied(pairs, draw), draw)
        + (draw(st.sampled_from(["x", "}", "\\u0000", "{}"])) if draw(st.integers(0, 15)) == 0 else draw(SPACE))
    )
    body, headers = head.encode(), {"Content-Type": "application/json"}
    if binary or draw(st.integers(0, 9)) == 0:
        n = len(body)
        headers["Inference-Header-Content-Length"] = draw(
            st.sampled_from([str(n)] * 30 + [hex(n), f"{n / 100:g}e2", f"0{n}", f"+{n}", f" {n}", str(n + 1)])
        )
        body += b"".join(binary)
    return Request(f"/v2/models/{model}/infer", headers, body, head[:300])
