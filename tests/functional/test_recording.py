"""Recording at the edge (`make serve RECORD=1|values`): HTTP and gRPC requests, refused ones included, each
a line with its model, protocol, shapes, status and duration; values only where asked; private files;
streams still flow through the gRPC listener."""

import base64
import json
import stat

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.functional.conftest import behind_edge, endpoint_of
from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.common.traffic import read_recording, recording_files
from tpserve.server.edge.recording import record_settings
from tpserve.server.single import start_single
from tpserve.server.stack import stop_stack

pytestmark = pytest.mark.functional
GOOD = np.zeros((2, 1, 8, 8), np.float32)


@pytest.fixture(scope="module")
def recorded(digits_build, tmp_path_factory):
    """A server recording values; every kind of request sent once; the recording read after the stop."""
    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("recorded")
    build_model(BuildRequest(spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work"), built)
    recording = record_settings("values", root / "state")
    settings = behind_edge(root / "repo", root / "state", record=recording, grpc_streaming=True)  # a stream passes
    start_single(settings)
    try:
        _send_each_kind(settings)
    finally:
        stop_stack(settings.state_dir)  # Envoy flushes its access log as it stops
    return settings, sorted(read_recording(settings.record.folder), key=lambda r: r.arrival_us)


def _send_each_kind(settings) -> None:
    state = endpoints.read_state(settings.state_dir)
    for protocol in ("http", "grpc"):
        infer(endpoint_of(state, settings.repo, protocol), "digits_cnn", {"input": GOOD})
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", settings.http_port, timeout=30)
    bad = {"inputs": [{"name": "input", "shape": [1, 1, 8, 9], "datatype": "FP32", "data": [0.0] * 72}]}
    conn.request("POST", "/v2/models/digits_cnn/versions/1/infer", body=json.dumps(bad))
    assert conn.getresponse().status == 400
    conn.close()
    _send_hostile_grpc(state.grpc_url)
    _stream_once(state.grpc_url)  # the server still answers after them


def _send_hostile_grpc(url: str) -> None:
    """A message that is not protobuf, and one with a 100-dim shape: the server answers each with an error,
    the recording leaves both out (its Lua reads at most 64 dims and refuses nothing)."""
    import grpc
    from tritonclient.grpc import service_pb2

    wide = service_pb2.ModelInferRequest(model_name="digits_cnn")
    wide.inputs.add(name="input", datatype="FP32", shape=[1] * 100)
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for body in (b"\xff\xff\xff\xff\x0f not protobuf", wide.SerializeToString()):
            with pytest.raises(grpc.RpcError):
                call(body, timeout=30)


def _stream_once(url: str) -> None:
    answers = []
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.append(error or result))
    tensor = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1, 8, 8), np.float32))
    client.async_stream_infer("digits_cnn", [tensor])
    client.stop_stream()
    client.close()
    assert len(answers) == 1 and not isinstance(answers[0], Exception), answers


def test_each_request_is_a_line_with_its_shapes_protocol_and_status(recorded):
    _, lines = recorded
    unary = [r for r in lines if r.inputs]
    assert {(r.protocol, r.status) for r in unary} == {("http", 200), ("grpc", 0)}
    for r in unary:
        assert r.model == "digits_cnn" and r.batch == 2 and r.duration_us > 0 and r.bytes > 0
        assert r.signature() == (("input", "FP32", (2, 1, 8, 8)),)
    refused = [r for r in lines if r.status == 400]
    assert len(refused) == 1 and refused[0].version == "1" and refused[0].inputs == ()
    assert len(lines) == 3, "streams and unreadable or oversized messages pass unrecorded"


def test_the_edge_stopped_cleanly_so_it_wrote_every_line_it_held(recorded):
    settings, _ = recorded
    log = (settings.state_dir / "envoy.log").read_text()
    assert "envoy stopped with code 0" in log and "restarting" not in log, log[-2000:]


def test_values_are_the_bodies_as_sent(recorded):
    _, lines = recorded
    by_protocol = {r.protocol: r for r in lines if r.inputs}
    http_body = base64.b64decode(by_protocol["http"].values["body"])
    header = by_protocol["http"].values["header_length"]
    assert json.loads(http_body[:header])["inputs"][0]["shape"] == [2, 1, 8, 8]
    assert len(http_body) - header == GOOD.nbytes
    grpc_body = base64.b64decode(by_protocol["grpc"].values["body"])
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest.FromString(grpc_body)
    assert message.model_name == "digits_cnn" and message.raw_input_contents[0] == GOOD.tobytes()


def test_the_recording_is_private(recorded):
    settings, _ = recorded
    assert stat.S_IMODE(settings.record.folder.stat().st_mode) == 0o700
    for path in recording_files(settings.record.folder):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.fixture(scope="module")
def shapes_recorded(digits_build, tmp_path_factory):
    """A server recording shapes only, reading each gRPC message's first 2,000 bytes: a small request whole, a
    batch of 16 (4 KiB of raw contents) from its head, one whose header runs past the first 512 bytes read,
    one with quotes, a backslash and a control byte in its input's name (the server refuses it), one whose name
    is not UTF-8 (the server cannot parse it), and one whose typed contents run past the head."""
    from dataclasses import replace

    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("shapes")
    build_model(BuildRequest(spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work"), built)
    settings = behind_edge(root / "repo", root / "state", grpc_streaming=True)  # a stream recorded from its head
    settings = replace(settings, record=replace(record_settings("1", root / "state"), head_bytes=2000))
    start_single(settings)
    try:
        state = endpoints.read_state(settings.state_dir)
        ep = endpoint_of(state, settings.repo, "grpc")
        answers = [infer(ep, "digits_cnn", {"input": np.zeros((n, 1, 8, 8), np.float32)}) for n in (1, 16)]
        answers.append(_raw_call(state.grpc_url, _long_header()))
        with pytest.raises(Exception, match="input"):
            _raw_call(state.grpc_url, _odd_name())
        with pytest.raises(Exception, match="parse"):  # not UTF-8: the server cannot read it
            _raw_call(state.grpc_url, _odd_name("PLACEHOLDER"), replace=(b"PLACEHOLDER", b"in\xffput!!!!!"))
        answers.append(_typed_contents(state.grpc_url))
        _stream_once(state.grpc_url)
    finally:
        stop_stack(settings.state_dir)
    return answers, sorted(read_recording(settings.record.folder), key=lambda r: r.arrival_us)


def _raw_call(url: str, message, replace=(b"", b"")):
    """message sent as its bytes, replace[0] in them swapped for replace[1] (same length)."""
    import grpc
    from tritonclient.grpc import service_pb2

    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        return service_pb2.ModelInferResponse.FromString(
            call(message.SerializeToString().replace(*replace), timeout=30)
        )


def _message(name: str, batch: int):
    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest(model_name="digits_cnn")
    message.inputs.add(name=name, datatype="FP32", shape=[batch, 1, 8, 8])
    return message


def _long_header():
    """A request parameter of 1,000 bytes ahead of the inputs, raw contents behind them."""
    message = _message("input", 2)
    message.parameters["note"].string_param = "n" * 1000
    message.raw_input_contents.append(np.zeros((2, 1, 8, 8), np.float32).tobytes())
    return message


def _odd_name(name='in"p\\ut\x01'):
    message = _message(name, 1)
    message.raw_input_contents.append(np.zeros((1, 1, 8, 8), np.float32).tobytes())
    return message


def _typed_contents(url: str):
    """Inputs as typed contents (fp32_contents, 4 KiB), past the 2,000 bytes read: answered, not recorded."""
    message = _message("input", 16)
    message.inputs[0].contents.fp32_contents.extend([0.0] * 1024)
    return _raw_call(url, message)


def test_shapes_only_grpc_is_read_from_the_head_as_it_streams(shapes_recorded):
    answers, lines = shapes_recorded
    shapes = [list(a.outputs["logits"].shape) for a in answers[:2]] + [list(a.outputs[0].shape) for a in answers[2:4]]
    assert shapes == [[1, 10], [16, 10], [2, 10], [16, 10]]
    assert [(r.protocol, r.status == 0, r.batch, r.signature()) for r in lines[:5]] == [
        ("grpc", True, 1, (("input", "FP32", (1, 1, 8, 8)),)),
        ("grpc", True, 16, (("input", "FP32", (16, 1, 8, 8)),)),
        ("grpc", True, 2, (("input", "FP32", (2, 1, 8, 8)),)),
        ("grpc", False, 1, (('in"p\\ut\x01', "FP32", (1, 1, 8, 8)),)),
        ("grpc", False, 1, (("in\xffput!!!!!", "FP32", (1, 1, 8, 8)),)),  # Envoy writes it escaped, each byte a char
    ], "typed contents past the head and the stream pass unrecorded"
    assert all(r.values is None for r in lines) and lines[1].bytes > 16 * 256
