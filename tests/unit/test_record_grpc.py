"""The native gRPC recorder (server/edge/record_grpc.c) read through a stand-in for Envoy's side of the ABI
(tests/fixtures/record_grpc/harness.c): what it records for each message, however the body is cut into chunks,
and what it leaves unrecorded. Through the real Envoy: tests/functional/test_recording.py."""

from __future__ import annotations

import ctypes
import json
import random
import stat
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tpserve.common.native_build import c_compiler
from tpserve.server.edge.record_module import MODULE_COMMON, SOURCE, module_config

HARNESS = Path(__file__).parent.parent / "fixtures" / "record_grpc" / "harness.c"
INFER = b"/inference.GRPCInferenceService/ModelInfer"


class Buffer(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("length", ctypes.c_size_t)]


@pytest.fixture(scope="module")
def recorder(tmp_path_factory):
    compiler = c_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc): the recorder is built by make install")
    folder = tmp_path_factory.mktemp("record_grpc")
    harness, module = folder / "libharness.so", folder / "librecord_grpc.so"
    for sources, target in (((HARNESS,), harness), ((SOURCE, MODULE_COMMON), module)):
        command = [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(target), *map(str, sources)]
        subprocess.run(command, check=True)
    envoy = ctypes.CDLL(str(harness), mode=ctypes.RTLD_GLOBAL)  # the callbacks the module binds to
    lib = ctypes.CDLL(str(module))
    lib.envoy_dynamic_module_on_http_filter_config_new.argtypes = [ctypes.c_void_p, Buffer, Buffer]
    lib.envoy_dynamic_module_on_http_filter_config_new.restype = ctypes.c_void_p
    lib.envoy_dynamic_module_on_http_filter_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.envoy_dynamic_module_on_http_filter_new.restype = ctypes.c_void_p
    for hook in ("request_headers", "request_body"):
        getattr(lib, f"envoy_dynamic_module_on_http_filter_{hook}").argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_bool,
        ]
    lib.envoy_dynamic_module_on_http_filter_destroy.argtypes = [ctypes.c_void_p]
    lib.envoy_dynamic_module_on_http_filter_stream_complete.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    envoy.harness_set_status.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.envoy_dynamic_module_on_http_filter_config_destroy.argtypes = [ctypes.c_void_p]
    envoy.harness_set_chunks.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    envoy.harness_set_replay.argtypes = [ctypes.c_char_p]
    return lib, envoy


def _buffer(data: bytes) -> tuple[Buffer, ctypes.Array]:
    held = ctypes.create_string_buffer(data, len(data))
    return Buffer(ctypes.cast(held, ctypes.c_void_p), len(data)), held


def _config(lib, head_bytes=65536, models=None, log=None, value_bytes=None):
    name, held_name = _buffer(b"record_grpc")
    models = models if models is not None else {"digits_cnn": 16}
    text, held_text = _buffer(module_config(models, head_bytes, log, value_bytes).encode())
    return lib.envoy_dynamic_module_on_http_filter_config_new(None, name, text)


def _record(recorder, body: bytes, cuts=(), path=INFER, config=None, complete=False) -> str | None:
    """Send body through one stream, cut into chunks at cuts (each call gets one chunk); the line, or None.
    complete: the stream completes (the module writes its own line there, where it has a log) before it goes."""
    lib, envoy = recorder
    config = config or _config(lib)
    held_path = ctypes.create_string_buffer(path, len(path))
    envoy.harness_set_path(held_path, len(path))
    envoy.harness_reset()
    stream = lib.envoy_dynamic_module_on_http_filter_new(config, None)
    lib.envoy_dynamic_module_on_http_filter_request_headers(None, stream, False)
    edges = [0, *sorted(cuts), len(body)]
    for i, (a, b) in enumerate(zip(edges, edges[1:])):
        chunk, held = _buffer(body[a:b])
        chunks = (Buffer * 1)(chunk)
        envoy.harness_set_chunks(chunks, 1 if b > a else 0)
        lib.envoy_dynamic_module_on_http_filter_request_body(None, stream, i == len(edges) - 2)
    if complete:
        lib.envoy_dynamic_module_on_http_filter_stream_complete(None, stream)
    lib.envoy_dynamic_module_on_http_filter_destroy(stream)
    out = ctypes.create_string_buffer(1 << 20)
    n = envoy.harness_recorded(out, len(out))
    assert envoy.harness_recorded_times() <= 1, "one line a request"
    return out.raw[:n].decode("utf-8", "surrogateescape") if envoy.harness_recorded_times() else None


def _framed(message) -> bytes:
    body = message.SerializeToString()
    return b"\0" + struct.pack(">I", len(body)) + body


def _message(model="digits_cnn", version="", inputs=(("input", "FP32", (2, 1, 8, 8)),), raw=True):
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, datatype, shape in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=list(shape))
    message.outputs.add(name="logits")
    if raw:
        message.raw_input_contents.append(np.zeros(2 * 64, np.float32).tobytes())
    return message


def _expected(model, version, inputs, batch) -> dict:
    return {"model": model, "version": version, "inputs": [[n, d, list(s)] for n, d, s in inputs], "batch": batch}


def test_a_request_is_recorded_however_its_body_is_cut(recorder):
    inputs = (("input", "FP32", (2, 1, 8, 8)), ("mask", "INT64", (2, 7)))
    body = _framed(_message(version="3", inputs=inputs))
    want = _expected("digits_cnn", "3", inputs, 2)
    for cut in range(1, 80):  # the frame's length prefix and the header split at every byte
        assert json.loads(_record(recorder, body, cuts=(cut,))) == want, cut
    assert json.loads(_record(recorder, body, cuts=range(1, 120))) == want  # a byte a chunk
    assert json.loads(_record(recorder, body)) == want


def test_batch_is_the_first_dim_only_for_a_batching_model(recorder):
    lib, _ = recorder
    inputs = (("input", "FP32", (5, 3)),)
    unbatched = _config(lib, models={"digits_cnn": 0})
    assert json.loads(_record(recorder, _framed(_message(inputs=inputs))))["batch"] == 5
    assert json.loads(_record(recorder, _framed(_message(inputs=inputs)), config=unbatched))["batch"] == 1
    other = _framed(_message(model="not_ours", inputs=inputs))
    assert json.loads(_record(recorder, other)) == _expected("not_ours", "", inputs, 1)


def test_names_are_escaped_as_json_and_negative_dims_read_as_int64(recorder):
    inputs = (('in"p\\ut\x01\x7f', "FP32", (-1, 4)),)
    assert json.loads(_record(recorder, _framed(_message(inputs=inputs)))) == _expected("digits_cnn", "", inputs, -1)
    extremes = (("x", "INT64", (-(2**63), 2**63 - 1, 0, 10, -10)),)  # the module's own digits, not printf's
    line = _record(recorder, _framed(_message(inputs=extremes)))
    assert json.loads(line) == _expected("digits_cnn", "", extremes, -(2**63))


@pytest.mark.parametrize(
    "raw, read",
    [
        ("é日本🙂".encode(), "é日本🙂"),  # well-formed UTF-8 as it is
        (b"in\xffput", "in\xffput"),  # a byte of no sequence: the character of its number, as Envoy wrote it
        (b"a\xc3", "a\xc3"),  # a sequence cut short
        (b"\xc0\x80", "\xc0\x80"),  # overlong
        (b"\xed\xa0\x80", "\xed\xa0\x80"),  # a surrogate
        (b"\xf4\x90\x80\x80", "\xf4\x90\x80\x80"),  # past U+10FFFF
    ],
)
def test_a_name_that_is_not_utf8_is_escaped_a_byte_a_character_and_the_line_stays_utf8(recorder, raw, read):
    placeholder = "P" * len(raw)
    body = _framed(_message(inputs=((placeholder, "FP32", (1, 4)),))).replace(placeholder.encode(), raw)
    line = _record(recorder, body)
    line.encode("utf-8")  # no lone surrogate from undecodable bytes: the text is well-formed
    assert json.loads(line)["inputs"][0][0] == read


def test_a_header_past_the_first_bytes_is_read_up_to_head_bytes(recorder):
    lib, _ = recorder
    message = _message()
    message.parameters["note"].string_param = "n" * 1000  # field 4, ahead of the inputs
    body = _framed(message)
    want = _expected("digits_cnn", "", (("input", "FP32", (2, 1, 8, 8)),), 2)
    assert json.loads(_record(recorder, body, cuts=(300, 700), config=_config(lib, head_bytes=2000))) == want
    assert _record(recorder, body, config=_config(lib, head_bytes=600)) is None  # the inputs lie past what is read


def test_what_cannot_be_read_goes_on_unrecorded(recorder):
    good = _framed(_message())
    assert _record(recorder, good, path=b"/inference.GRPCInferenceService/ModelStreamInfer") is None
    assert _record(recorder, b"\1" + good[1:]) is None  # compressed
    assert _record(recorder, _framed(_message(model=""))) is None  # no model named
    too_many = tuple((f"i{i}", "FP32", (1,)) for i in range(65))
    assert _record(recorder, _framed(_message(inputs=too_many))) is None
    assert _record(recorder, _framed(_message(inputs=(("x" * 257, "FP32", (1,)),)))) is None
    assert _record(recorder, _framed(_message(inputs=(("x", "FP32", (1,) * 65),)))) is None
    body = good[5:]
    truncated = b"\0" + struct.pack(">I", 40) + body[:40]  # a frame that ends inside an input
    assert _record(recorder, truncated) is None


def test_typed_contents_past_the_head_leave_the_request_unrecorded_and_raw_ones_do_not(recorder):
    lib, _ = recorder
    typed = _message(inputs=(("input", "FP32", (16, 64)),), raw=False)
    typed.inputs[0].contents.fp32_contents.extend([0.0] * 1024)
    assert _record(recorder, _framed(typed), config=_config(lib, head_bytes=2000)) is None
    raw = _message(inputs=(("input", "FP32", (16, 64)),))
    raw.raw_input_contents[0] = np.zeros(16 * 64, np.float32).tobytes()
    assert json.loads(_record(recorder, _framed(raw), config=_config(lib, head_bytes=2000)))["batch"] == 16


def test_random_bytes_never_crash_it(recorder):
    rng = random.Random(7)
    good = _framed(_message())
    for _ in range(3000):
        body = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        body = bytes(body[: rng.randint(0, len(body))])
        cuts = sorted(rng.sample(range(1, max(len(body), 2)), min(3, max(len(body) - 1, 0))))
        line = _record(recorder, body, cuts=cuts)
        assert line is None or line.startswith('{"model":')


def test_the_config_names_models_as_hex_and_a_bad_config_is_refused(recorder):
    lib, _ = recorder
    assert module_config({"a b\n": 4, "m": 0}, 100) == "head_bytes 100\n4 6120620a\n0 6d\n"
    for text in (b"", b"head_bytes 0\n", b"head_bytes 9\n4 6\n", b"head_bytes 9\nx 6d\n"):
        name, held_name = _buffer(b"record_grpc")
        given, held_text = _buffer(text)
        assert lib.envoy_dynamic_module_on_http_filter_config_new(None, name, given) is None, text
    name, held_name = _buffer(b"something_else")
    given, held_text = _buffer(b"head_bytes 9\n")
    assert lib.envoy_dynamic_module_on_http_filter_config_new(None, name, given) is None


def _logged(path: Path) -> list:
    from tpserve.common.traffic import RecordedRequest

    return [RecordedRequest.from_line(line) for line in path.read_text().splitlines()]


def test_with_a_log_the_module_writes_each_request_line_itself(recorder, tmp_path):
    lib, envoy = recorder
    log = tmp_path / "traffic-current-grpc.jsonl"
    config = _config(lib, log=log)
    assert config and log.exists() and stat.S_IMODE(log.stat().st_mode) == 0o600
    inputs = (("input", "FP32", (2, 1, 8, 8)),)
    body = _framed(_message(version="3", inputs=inputs))
    began = time.time_ns() // 1000
    outcomes = [("0", None), (None, "5"), (None, None)]  # trailers; a trailers-only answer; none (a reset)
    for trailer, header in outcomes:
        envoy.harness_set_status(trailer and trailer.encode(), header and header.encode())
        assert _record(recorder, body, cuts=(3, 40, 200), config=config, complete=True) is None, "no metadata"
    envoy.harness_set_status(None, None)
    _record(recorder, body, config=config)  # destroyed without completing: still one line, no status
    _record(recorder, body, config=config, path=b"/inference.GRPCInferenceService/ModelReady", complete=True)
    lib.envoy_dynamic_module_on_http_filter_config_destroy(config)  # the writer writes what is pending, ends
    lines = _logged(log)
    assert [r.status for r in lines] == [0, 5, -1, -1], "one line a ModelInfer call, none for another call"
    for r in lines:
        assert (r.model, r.version, r.protocol, r.batch, r.bytes) == ("digits_cnn", "3", "grpc", 2, len(body))
        assert r.signature() == (("input", "FP32", (2, 1, 8, 8)),)
        assert began <= r.arrival_us <= time.time_ns() // 1000 and 0 <= r.duration_us < 60_000_000


def test_a_request_a_replay_sent_is_marked_replayed_in_the_line_and_the_metadata(recorder, tmp_path):
    from tpserve.common.traffic import REPLAY_HEADER, RecordedRequest

    assert REPLAY_HEADER == "x-traffic-replay"  # the header the module looks for (harness.c answers it)
    lib, envoy = recorder
    log = tmp_path / "traffic-current-grpc.jsonl"
    config = _config(lib, log=log)
    body = _framed(_message())
    envoy.harness_set_status(b"0", None)
    for mark in (b"1", None):
        envoy.harness_set_replay(mark)
        _record(recorder, body, config=config, complete=True)
    envoy.harness_set_replay(b"1")
    as_metadata = _record(recorder, body)  # no log: the access log writes the metadata's JSON text
    envoy.harness_set_replay(None)
    envoy.harness_set_status(None, None)
    lib.envoy_dynamic_module_on_http_filter_config_destroy(config)
    assert [r.replayed for r in _logged(log)] == [True, False]
    assert json.loads(as_metadata)["replayed"] is True
    line = {"t": 1, "protocol": "grpc", "request": as_metadata}
    assert RecordedRequest.from_line(json.dumps(line)).replayed


def test_the_module_writes_on_after_the_file_is_rotated_and_refuses_a_bad_log_line(recorder, tmp_path):
    lib, envoy = recorder
    log = tmp_path / "traffic-current-grpc.jsonl"
    config = _config(lib, log=log)
    body = _framed(_message())
    envoy.harness_set_status(b"0", None)
    _record(recorder, body, config=config, complete=True)
    deadline = time.monotonic() + 10
    while not log.read_text() and time.monotonic() < deadline:  # written within a second, unasked
        time.sleep(0.05)
    log.rename(tmp_path / "traffic-000001.jsonl")  # the keeper's rotation
    for _ in range(3):
        _record(recorder, body, config=config, complete=True)
    lib.envoy_dynamic_module_on_http_filter_config_destroy(config)
    assert len(_logged(tmp_path / "traffic-000001.jsonl")) == 1 and len(_logged(log)) == 3
    name, _ = _buffer(b"record_grpc")
    twice = str(tmp_path / "twice.jsonl").encode().hex()
    for text in (
        "head_bytes 10\nlog 7265\n",  # not absolute
        f"head_bytes 10\nlog {twice}\nlog {twice}\n",  # twice
        "head_bytes 10\nlog 2f6e6f2f73756368\n",  # /no/such: cannot be opened
        "head_bytes 10\nlog 2f00\n",  # a NUL
    ):
        held = ctypes.create_string_buffer(text.encode())
        assert not lib.envoy_dynamic_module_on_http_filter_config_new(
            None, name, Buffer(ctypes.cast(held, ctypes.c_void_p), len(text))
        ), text
    envoy.harness_set_status(None, None)


def test_the_module_is_used_only_with_the_envoy_it_is_built_for(tmp_path):
    from tpserve.server.edge.front import envoy_binary
    from tpserve.server.edge.record_module import runs_on

    assert runs_on(envoy_binary())
    other = tmp_path / "envoy"
    other.write_text("#!/bin/sh\necho 'envoy  version: 0/1.33.2/Clean/RELEASE/BoringSSL'\n")
    other.chmod(0o700)
    assert not runs_on(other) and not runs_on(tmp_path / "missing")


def test_with_values_the_line_keeps_the_message_as_sent_however_it_is_cut(recorder, tmp_path):
    """RECORD=values: the module copies the body as it passes (nothing held back) and writes the message into the
    line, base64, where it is one whole uncompressed message within the cap; past the cap, shapes alone."""
    import base64

    from tritonclient.grpc import service_pb2

    lib, envoy = recorder
    log = tmp_path / "traffic-current-grpc.jsonl"
    message = _message(version="2")
    body = _framed(message)
    cap = len(body) - 5  # the message exactly: kept
    config = _config(lib, log=log, value_bytes=cap)
    envoy.harness_set_status(b"0", None)
    for cuts in ((), (1,), (3, 5, 6), (40, 200, len(body) - 1)):
        _record(recorder, body, cuts=cuts, config=config, complete=True)
    _record(recorder, body + _framed(message), config=config, complete=True)  # two messages: no values
    _record(recorder, body[:-1], config=config, complete=True)  # cut short: no values
    compressed = b"\1" + body[1:]
    _record(recorder, compressed, config=config, complete=True)  # compressed: not read, no line
    lib.envoy_dynamic_module_on_http_filter_config_destroy(config)
    small = _config(lib, log=tmp_path / "small.jsonl", value_bytes=cap - 1)  # one byte short: shapes alone
    _record(recorder, body, cuts=(100,), config=small, complete=True)
    lib.envoy_dynamic_module_on_http_filter_config_destroy(small)
    envoy.harness_set_status(None, None)
    lines = _logged(log)
    assert len(lines) == 6 and all(r.signature() == (("input", "FP32", (2, 1, 8, 8)),) for r in lines)
    for r in lines[:4]:
        assert r.values["header_length"] == 0
        kept = service_pb2.ModelInferRequest.FromString(base64.b64decode(r.values["body"]))
        assert kept == message and base64.b64decode(r.values["body"]) == body[5:]
    assert [r.values for r in lines[4:]] == [None, None]
    (past,) = _logged(tmp_path / "small.jsonl")
    assert past.values is None and past.model == "digits_cnn"


def test_a_values_config_needs_the_log_and_a_cap_it_can_hold(recorder, tmp_path):
    lib, _ = recorder
    log = str(tmp_path / "v.jsonl").encode().hex()
    assert module_config({"m": 0}, 100, tmp_path / "v.jsonl", 7) == f"head_bytes 100\nvalues 7\nlog {log}\n0 6d\n"
    name, _ = _buffer(b"record_grpc")
    for text in (
        "head_bytes 10\nvalues 10\n",  # no log: bodies go into the module's own lines only
        f"head_bytes 10\nvalues -1\nlog {log}\n",
        f"head_bytes 10\nvalues {(1 << 30) + 1}\nlog {log}\n",  # past 1 GiB
        f"head_bytes 10\nvalues 10\nvalues 10\nlog {log}\n",  # twice
        f"head_bytes 10\nlog {log}\nvalues 10\n",  # after the log
        f"head_bytes 10\nvalues 10x\nlog {log}\n",
    ):
        held = ctypes.create_string_buffer(text.encode())
        assert not lib.envoy_dynamic_module_on_http_filter_config_new(
            None, name, Buffer(ctypes.cast(held, ctypes.c_void_p), len(text))
        ), text
    fine = f"head_bytes 10\nvalues 0\nlog {log}\n".encode()
    held = ctypes.create_string_buffer(fine)
    config = lib.envoy_dynamic_module_on_http_filter_config_new(
        None, name, Buffer(ctypes.cast(held, ctypes.c_void_p), len(fine))
    )
    assert config
    lib.envoy_dynamic_module_on_http_filter_config_destroy(config)
