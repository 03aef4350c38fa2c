"""The ModelStreamInfer message check (server/triton/front/grpc_messages.c) against protobuf itself: its schema is
service_pb2's, every message protobuf writes passes it however it is split, and it never passes a message protobuf
cannot read (generated messages with bytes flipped, cut, dropped or added); it may refuse more (it is strict)."""

import ctypes
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
TYPES = ["ModelInferRequest", "InferInputTensor", "InferRequestedOutputTensor", "ENTRY", "InferParameter",
         "InferTensorContents"]  # fmt: skip


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    from tpserve.common.native_build import c_compiler

    compiler = c_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc): the guard is built where it serves")
    target = tmp_path_factory.mktemp("messages") / "messages.so"
    sources = [
        ROOT / "tests" / "native" / "message_harness.c",
        ROOT / "tpserve" / "server" / "triton" / "front" / "grpc_messages.c",
    ]
    command = [
        compiler,
        "-shared",
        "-fPIC",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-o",
        str(target),
        *map(str, sources),
    ]
    subprocess.run(command, check=True)
    library = ctypes.CDLL(str(target))
    library.check_stream.restype = ctypes.c_long
    library.check_stream.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    return library


def framed(body: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + struct.pack(">I", len(body)) + body


def protobuf_reads(body: bytes) -> bool:
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2 as pb

    try:
        pb.ModelInferRequest.FromString(body)
        return True
    except (DecodeError, RuntimeError, ValueError):
        return False


def expected_rule(field) -> int:
    """What the check must read a length-delimited field as (grpc_messages.c: kind << 8 | sub-type)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == F.LABEL_REPEATED
    if field.type == F.TYPE_STRING:
        return 1 << 8
    if field.type == F.TYPE_MESSAGE:
        name = "ENTRY" if field.message_type.GetOptions().map_entry else field.message_type.name
        return 2 << 8 | TYPES.index(name)
    if repeated and field.type in (F.TYPE_INT64, F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_BOOL):
        return 3 << 8
    if repeated and field.type == F.TYPE_FLOAT:
        return 4 << 8
    if repeated and field.type == F.TYPE_DOUBLE:
        return 5 << 8
    return 0


def test_the_schema_is_service_pb2s(check):
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest.DESCRIPTOR
    descriptors = {
        "ModelInferRequest": [request],
        "InferInputTensor": [pb.ModelInferRequest.InferInputTensor.DESCRIPTOR],
        "InferRequestedOutputTensor": [pb.ModelInferRequest.InferRequestedOutputTensor.DESCRIPTOR],
        "ENTRY": [d.message_type for m in (request, pb.ModelInferRequest.InferInputTensor.DESCRIPTOR,
                                            pb.ModelInferRequest.InferRequestedOutputTensor.DESCRIPTOR)
                  for d in m.fields if d.message_type is not None and d.message_type.GetOptions().map_entry],
        "InferParameter": [pb.InferParameter.DESCRIPTOR],
        "InferTensorContents": [pb.InferTensorContents.DESCRIPTOR],
    }  # fmt: skip
    for index, name in enumerate(TYPES):
        for descriptor in descriptors[name]:
            fields = {f.number: f for f in descriptor.fields}
            for number in range(1, 20):
                want = expected_rule(fields[number]) if number in fields else 0
                assert check.rule(index, number) == want, (descriptor.full_name, number)


TEXT = st.text(max_size=12)
PARAMETER = st.one_of(
    st.builds(dict, bool_param=st.booleans()),
    st.builds(dict, int64_param=st.integers(-(2**63), 2**63 - 1)),
    st.builds(dict, string_param=TEXT),
    st.builds(dict, double_param=st.floats(allow_nan=False)),
    st.builds(dict, uint64_param=st.integers(0, 2**64 - 1)),
)
CONTENTS = st.fixed_dictionaries(
    {},
    optional={
        "bool_contents": st.lists(st.booleans(), max_size=4),
        "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4),
        "int64_contents": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
        "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=4),
        "uint64_contents": st.lists(st.integers(0, 2**64 - 1), max_size=4),
        "fp32_contents": st.lists(st.floats(width=32, allow_nan=False), max_size=4),
        "fp64_contents": st.lists(st.floats(allow_nan=False), max_size=4),
        "bytes_contents": st.lists(st.binary(max_size=6), max_size=3),
    },
)


@st.composite
def requests(draw) -> bytes:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=draw(TEXT), model_version=draw(TEXT), id=draw(TEXT))
    for key, value in draw(st.dictionaries(TEXT, PARAMETER, max_size=3)).items():
        request.parameters[key].CopyFrom(pb.InferParameter(**value))
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(name=draw(TEXT), datatype=draw(TEXT))
        tensor.shape.extend(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4)))
        for key, value in draw(st.dictionaries(TEXT, PARAMETER, max_size=2)).items():
            tensor.parameters[key].CopyFrom(pb.InferParameter(**value))
        if draw(st.booleans()):
            tensor.contents.CopyFrom(pb.InferTensorContents(**draw(CONTENTS)))
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(TEXT))
        for key, value in draw(st.dictionaries(TEXT, PARAMETER, max_size=2)).items():
            output.parameters[key].CopyFrom(pb.InferParameter(**value))
    request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=16), max_size=3)))
    return request.SerializeToString()


@settings(max_examples=300, deadline=None)
@given(bodies=st.lists(requests(), min_size=1, max_size=3), piece=st.integers(1, 64))
def test_every_message_protobuf_writes_passes_however_split(check, bodies, piece):
    stream = b"".join(framed(b) for b in bodies)
    assert check.check_stream(stream, len(stream), piece) == len(bodies)


MUTATIONS = st.lists(
    st.tuples(st.sampled_from(["flip", "set", "drop", "insert", "cut"]), st.integers(0, 10**6), st.integers(0, 255)),
    min_size=1,
    max_size=4,
)


def mutated(body: bytes, mutations) -> bytes:
    data = bytearray(body)
    for kind, where, value in mutations:
        at = where % (len(data) + 1)
        if kind == "insert":
            data[at:at] = bytes([value])
        elif kind == "cut":
            del data[at:]
        elif at < len(data):
            if kind == "drop":
                del data[at]
            else:
                data[at] = data[at] ^ (1 << (value % 8)) if kind == "flip" else value
    return bytes(data)


@settings(max_examples=1500, deadline=None)
@given(body=requests(), mutations=MUTATIONS, piece=st.integers(1, 64))
def test_nothing_protobuf_cannot_read_passes(check, body, mutations, piece):
    changed = mutated(body, mutations)
    stream = framed(changed)
    passed = check.check_stream(stream, len(stream), piece) == 1
    assert not passed or protobuf_reads(changed), changed.hex()


@pytest.mark.parametrize(
    "body, why",
    [
        (b"\x00", "a tag of field 0"),
        (b"\x0e", "wire type 6"),
        (b"\x0c", "an end-group that ends no group"),
        (b"\x0b\x08\x01", "a group never ended"),
        (b"\x0a\x02\xc3\x28", "a model name that is not UTF-8"),
        (b"\x0a\x03\xed\xa0\x80", "a surrogate in UTF-8"),
        (b"\x0a\x05ab", "a length past the message"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "a varint past 10 bytes"),
        (b"\x2a\x05\x1a\x03\x01\x02", "a packed shape cut by its input's end"),
        (b"\x2a\x04\x2a\x02\x32\x03", "packed floats of 3 bytes"),
        (b"\x09\x01\x02", "a fixed64 cut by the message's end"),
        (b"\x0b" * 70 + b"\x0c" * 70, "nesting past the depth"),
    ],
)
def test_what_the_check_refuses(check, body, why):
    assert check.check_stream(framed(body), len(body) + 5, 7) == -1, why
    assert not protobuf_reads(body) or why == "nesting past the depth", why


def test_a_compressed_message_or_one_past_two_gigabytes_is_refused(check):
    assert check.check_stream(framed(b"", flag=1), 5, 5) == -1
    assert check.check_stream(b"\x00\x80\x00\x00\x00", 5, 5) == -1
    assert check.check_stream(framed(b""), 5, 1) == 1  # an empty message is a whole one
