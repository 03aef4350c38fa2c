"""Envoy as the edge (`FRONT=envoy`): requests that crashed tritonserver 2.51 are refused before it sees them,
on HTTP through Envoy and on gRPC straight to the server; the server's pid never changes, good requests pass."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.functional.conftest import behind_edge, endpoint_of
from tests.functional.load import ClosedLoop
from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.server.edge.front import ADMIN_SOCKET
from tpserve.server.single import start_single
from tpserve.server.stack import stop_stack

pytestmark = pytest.mark.functional
GOOD = np.zeros((1, 1, 8, 8), np.float32)
HUGE = [1, 1, 8, 2147483648]  # 64 GiB of FP32 declared in ~100 bytes


@pytest.fixture(scope="module")
def edged(digits_build, tmp_path_factory):
    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("edged")
    build_model(BuildRequest(spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work"), built)
    settings = behind_edge(root / "repo", root / "state")
    start_single(settings)
    yield settings
    stop_stack(settings.state_dir)


def _server_pid(settings) -> int:
    return endpoints.read_state(settings.state_dir / "replica-0").pid


def _http(settings, path: str, body: bytes, headers: dict | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", settings.http_port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read()[:400].decode(errors="replace")
    finally:
        conn.close()


def _infer_json(settings, inputs: list, model: str = "digits_cnn") -> tuple[int, str]:
    return _http(settings, f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}).encode())


def _still_serving(settings, pid: int) -> None:
    state = endpoints.read_state(settings.state_dir)
    for protocol in ("http", "grpc"):
        out = infer(endpoint_of(state, settings.repo, protocol), "digits_cnn", {"input": GOOD})
        assert out.outputs["logits"].shape == (1, 10)
    assert _server_pid(settings) == pid, "tritonserver was restarted: a request reached it and crashed it"


CRASHERS = {
    "huge shape, 4 values": [{"name": "input", "shape": HUGE, "datatype": "FP32", "data": [0, 0, 0, 0]}],
    "huge shape, unknown model rules": [{"name": "x", "shape": [1, 2**30], "datatype": "FP64", "data": [0]}],
    "dims over the config": [{"name": "input", "shape": [1, 1, 8, 1000000], "datatype": "FP32", "data": [0]}],
    "fewer values than the shape": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": [0]}],
    "batch over max_batch_size": [{"name": "input", "shape": [999, 1, 8, 8], "datatype": "FP32", "data": [0]}],
    "negative dim": [{"name": "input", "shape": [1, -1, 8, 8], "datatype": "FP32", "data": [0]}],
    "wrong datatype": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP64", "data": [0] * 64}],
}


@pytest.mark.parametrize("case", sorted(CRASHERS))
def test_a_request_that_cannot_be_valid_is_refused_at_the_edge(edged, case):
    pid = _server_pid(edged)
    model = "not_a_model" if "unknown" in case else "digits_cnn"
    status, body = _infer_json(edged, CRASHERS[case], model)
    assert status == 400 and "refused at the edge" in body, body
    _still_serving(edged, pid)


def test_deeply_nested_json_is_refused(edged):
    pid = _server_pid(edged)
    head = '{"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":'
    status, body = _http(edged, "/v2/models/digits_cnn/infer", (head + "[" * 200_000).encode())
    assert status == 400 and "nested deeper" in body, body
    _still_serving(edged, pid)


def test_a_body_over_the_cap_gets_413(edged):
    pid = _server_pid(edged)
    status, _ = _http(edged, "/v2/models/digits_cnn/infer", b"0" * (65 * 2**20))
    assert status == 413
    _still_serving(edged, pid)


def test_a_body_in_600000_one_byte_chunks_is_reassembled(edged):
    pid = _server_pid(edged)
    body = json.dumps(
        {
            "inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}],
            "pad": " " * 600_000,
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", edged.http_port), timeout=120) as sock:
        head = b"POST /v2/models/digits_cnn/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        sock.sendall(head + b"".join(b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))) + b"0\r\n\r\n")
        answer = sock.recv(200).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 200") or answer.startswith("HTTP/1.1 4"), answer
    _still_serving(edged, pid)


def test_binary_requests_are_checked_and_good_ones_pass(edged):
    pid = _server_pid(edged)
    header = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "parameters": {"binary_data_size": 10**9}}
            ]
        }
    ).encode()
    status, body = _http(
        edged,
        "/v2/models/digits_cnn/infer",
        header + GOOD.tobytes(),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400 and "binary_data_size" in body, body
    _still_serving(edged, pid)  # tritonclient sends binary data: the good path went through the edge


def test_grpc_refuses_the_huge_shape_without_crashing(edged):
    pid = _server_pid(edged)
    channel = grpc.insecure_channel(f"127.0.0.1:{edged.grpc_port}")
    tensor = service_pb2.ModelInferRequest().InferInputTensor(name="input", datatype="FP32", shape=HUGE)
    tensor.contents.fp32_contents.extend([0, 0, 0, 0])
    request = service_pb2.ModelInferRequest(model_name="digits_cnn", inputs=[tensor])
    with pytest.raises(grpc.RpcError) as info:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    _still_serving(edged, pid)


def test_a_load_carrying_files_is_refused_even_with_the_key(edged):
    state = endpoints.read_state(edged.state_dir / "replica-0")
    key = {"admin-key": state.admin_headers()["admin-key"]}
    config = json.dumps({"name": "x", "backend": "python", "max_batch_size": 0})
    body = json.dumps({"parameters": {"config": config, "file:1/model.py": "aW1wb3J0IG9z"}}).encode()
    status, answer = _http(edged, "/v2/repository/models/x/load", body, key)
    assert status == 403 and "cannot carry files" in answer
    conn = http.client.HTTPConnection(state.host, state.http_port, timeout=60)  # straight to tritonserver
    conn.request("POST", "/v2/repository/models/x/load", body=body, headers=key)
    direct = conn.getresponse()
    assert direct.status >= 400 and b"failed" in direct.read()  # the shim refused Triton's temporary folder
    conn.close()


def test_envoy_admin_is_a_private_socket(edged):
    path = edged.state_dir / ADMIN_SOCKET
    assert path.is_socket() and (path.stat().st_mode & 0o777) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another local user (runuser -u nobody)")
def test_another_local_user_sees_no_key_and_no_tensor(edged):
    state = endpoints.read_state(edged.state_dir / "replica-0")
    key = state.admin_headers()["admin-key"]
    seen = _as_nobody(
        f"cat /proc/{state.pid}/cmdline /proc/{state.pid}/environ 2>/dev/null; "
        "cat /dev/shm/triton_python_backend_shm_region_* 2>&1 | head -c 300"
    )
    assert key.encode() not in seen and b"@TRITON_ADMIN_KEY@" in seen
    assert b"Permission denied" in seen  # the Python backend's regions are 0600
    placeholder = {"admin-key": "@TRITON_ADMIN_KEY@"}
    status, _ = _http(edged, "/v2/repository/index", b"{}", placeholder)
    assert status == 403


def _as_nobody(script: str) -> bytes:
    return subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", script], capture_output=True, timeout=30).stdout


@pytest.mark.parametrize("front", [[], ["--front", "envoy"]], ids=["default", "envoy"])
def test_make_serve_style_start_returns_with_output_captured(digits_build, tmp_path, front):
    """`python -m tpserve.server start | tail` must end: nothing it leaves running holds the caller's output."""
    spec, built, _ = digits_build
    build_model(BuildRequest(spec=spec, target="embedded", repo=tmp_path / "repo", work_dir=tmp_path / "work"), built)
    ports = [str(p) for p in endpoints.free_ports(4)]
    command = [
        sys.executable,
        "-m",
        "tpserve.server",
        "start",
        "--repo",
        str(tmp_path / "repo"),
        "--http-port",
        ports[0],
        "--grpc-port",
        ports[1],
        "--metrics-port",
        ports[2],
        "--health-port",
        ports[3],
        "--state-dir",
        str(tmp_path / "state"),
        *front,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "edge: http" in done.stdout
        state = tmp_path / "state"
        shared = [str(p) for p in state.rglob("*") if p.stat().st_mode & 0o077 and not p.is_symlink()]
        assert shared == [], "files or folders other users can read"  # umask 077 for the server and its logs
    finally:
        subprocess.run(
            [sys.executable, "-m", "tpserve.server", "stop", "--state-dir", str(tmp_path / "state")], timeout=120
        )


DATA64 = ",".join(["0"] * 64)


def _body(shape: str, name: str = "input") -> str:
    return f'{{"inputs":[{{"name":"{name}",{shape},"datatype":"FP32","data":[{DATA64}]}}]}}'


TWO_READINGS = {  # bodies two JSON parsers read differently: tritonserver died on the first two (SIGABRT)
    "duplicate key": '{"inputs":[{"name":"input","shape":[1,1,8,2147483648],"datatype":"FP32","shape":[1,1,8,8],'
    f'"data":[{DATA64}]}}]}}',
    "escaped key": '{"inputs":[{"name":"input","sh\\u0061pe":[1,1,8,2147483648],"datatype":"FP32","shape":[1,1,8,8],'
    f'"data":[{DATA64}]}}]}}',
    "shape as a double": _body('"shape":[1,1,8,8.0]'),
    "shape with an exponent": _body('"shape":[1,1,8,8e0]'),
    "whitespace-padded data": '{"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[0'
    + " " * 200
    + "]}]}",
    "a number beyond a double": '{"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1e400'
    + ",0" * 63
    + "]}]}",
    "an escaped NUL in a name": _body('"shape":[1,1,8,8]', name="inp\\u0000ut"),
    # tritonserver answered these 500 ("attempt to access JSON non-number as double"): a clear 400 instead
    "a quoted NaN in the data": _body('"shape":[1,1,8,8]').replace("[0,", '["NaN",', 1),
    "null in the data": _body('"shape":[1,1,8,8]').replace("[0,", "[null,", 1),
}


@pytest.mark.parametrize("case", sorted(TWO_READINGS))
def test_a_body_two_parsers_read_differently_is_refused(edged, case):
    pid = _server_pid(edged)
    status, body = _http(edged, "/v2/models/digits_cnn/infer", TWO_READINGS[case].encode())
    assert status == 400, body
    _still_serving(edged, pid)


@pytest.mark.parametrize("length", ["0xa8", "1.68e2", "+168", "0168", " 168", "168,168"])
def test_an_inference_header_length_in_another_spelling_is_refused(edged, length):
    pid = _server_pid(edged)
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32"}]}).encode()
    status, body = _http(edged, "/v2/models/digits_cnn/infer", header, {"Inference-Header-Content-Length": length})
    assert status == 400 and "Inference-Header-Content-Length" in body, body
    _still_serving(edged, pid)


@pytest.mark.parametrize("path", ["/v2/models/digits_cnn/generate", "/v2/models/digits_cnn/generate_stream"])
def test_paths_the_edge_does_not_check_are_refused(edged, path):
    pid = _server_pid(edged)
    status, body = _http(edged, path, b"[" * 200_000)
    assert status == 404 and "not a path the edge serves" in body, body
    _still_serving(edged, pid)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("DELETE", "/v2/models/digits_cnn", 405),
        ("POST", "/v2/models/digits_cnn/config", 405),
        ("GET", "/v2/models/%64igits_cnn/ready", 400),
        ("POST", "/v2/repository/models/../load", 400),
        ("GET", "/v2/repository/other/index", 404),
        ("GET", "/v2/models/digits_cnn//ready", 404),
    ],
)
def test_methods_and_path_variants_outside_the_allowlist_are_refused(edged, method, path, status):
    conn = http.client.HTTPConnection("127.0.0.1", edged.http_port, timeout=30)
    conn.request(method, path, body=b"{}")
    answer = conn.getresponse()
    assert answer.status == status and answer.getheader("x-edge") == "refused", answer.read()


def test_parameter_and_array_bombs_are_refused_quickly(edged):
    pid = _server_pid(edged)
    params = "{" + ",".join(f'"p{i}":{i}' for i in range(77_000)) + "}"
    inputs = f'[{{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[{DATA64}]}}]'
    status, body = _http(edged, "/v2/models/digits_cnn/infer", f'{{"parameters":{params},"inputs":{inputs}}}'.encode())
    assert status == 400 and "more than 64 keys" in body, body
    outputs = "[" + ",".join('{"name":"logits"}' for _ in range(100_000)) + "]"
    status, body = _http(edged, "/v2/models/digits_cnn/infer", f'{{"inputs":{inputs},"outputs":{outputs}}}'.encode())
    assert status == 400 and "more than 64 items" in body, body
    _still_serving(edged, pid)


def test_an_encoded_body_gets_415_with_a_readable_error(edged):
    import gzip

    body = gzip.compress(json.dumps({"inputs": CRASHERS["negative dim"]}).encode())
    status, answer = _http(edged, "/v2/models/digits_cnn/infer", body, {"Content-Encoding": "gzip"})
    assert status == 415 and "send the body uncompressed" in answer, answer


@pytest.mark.parametrize("kb", [20, 59])
def test_large_headers_get_431(edged, kb):
    pid = _server_pid(edged)
    status, _ = _http(edged, "/v2/health/ready", b"", {"X-Big": "a" * (kb * 1024)})
    assert status == 431
    _still_serving(edged, pid)


def test_a_config_override_cannot_leave_the_model_folder(edged, tmp_path):
    """At the edge (403), and on tritonserver's own port through the shim: the file outside never runs."""
    state = endpoints.read_state(edged.state_dir / "replica-0")
    key = {"admin-key": state.admin_headers()["admin-key"]}
    marker = tmp_path / "ran"
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    outside = "../" * 12 + str(tmp_path / "1" / "model.py").lstrip("/")
    for filename, why in ((outside, "outside"), ("missing.py", "does not exist"), ("model.py; touch x", "outside")):
        config = json.dumps({"name": "digits_cnn", "backend": "python", "default_model_filename": filename})
        body = json.dumps({"parameters": {"config": config}}).encode()
        if "/" in filename:
            status, answer = _http(edged, "/v2/repository/models/digits_cnn/load", body, key)
            assert status == 403 and "default_model_filename" in answer, answer
        conn = http.client.HTTPConnection(state.host, state.http_port, timeout=60)  # straight to tritonserver
        conn.request("POST", "/v2/repository/models/digits_cnn/load", body=body, headers=key)
        direct = conn.getresponse()
        text = direct.read().decode(errors="replace")
        conn.close()
        assert direct.status == 400 and why in text, text  # refused at once, with why
    assert not marker.exists(), "the model file outside the repository ran"
    _still_serving(edged, _server_pid(edged))  # the old version kept serving


@pytest.mark.parametrize("key", ["backend", "parameters", "model_warmup", "runtime"])
def test_a_config_override_cannot_name_code_or_files(edged, key):
    state = endpoints.read_state(edged.state_dir / "replica-0")
    config = json.dumps({"name": "digits_cnn", key: "x"})
    body = json.dumps({"parameters": {"config": config}}).encode()
    status, answer = _http(edged, "/v2/repository/models/digits_cnn/load", body, state.admin_headers())
    assert status == 403 and key in answer, answer


def test_a_server_that_stalls_for_a_moment_loses_no_request_through_the_edge(edged):
    """A single server that answers nothing for 1.6 s (SIGSTOP: a swap storm, a busy host) misses a liveness check,
    so its supervisor says "not ready" for a moment. With no other replica to send them to, the edge keeps sending
    requests there (they wait, then are answered) rather than failing every one with "no healthy upstream"."""
    state = endpoints.read_state(edged.state_dir)
    fronts = [endpoint_of(state, edged.repo, p) for p in ("http", "grpc")]
    pid = _server_pid(edged)
    with ClosedLoop(fronts, "digits_cnn", {"input": GOOD}, settle=1.0) as load:
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(1.6)
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(2.0)  # readiness back, and Envoy's next health check sees it
    counts = load.counts()
    print(f"a 1.6 s stall under load: {counts} (protocol: requests, failed)")
    assert _server_pid(edged) == pid and load.failures() == [], load.failures()[:5]
    assert all(requests > 10 for requests, _ in counts.values())
