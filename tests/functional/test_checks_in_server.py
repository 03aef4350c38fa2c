"""The edge's HTTP checks inside tritonserver's own reads (`make serve`'s default front,
server/triton/front/http_front.c): the requests that crashed tritonserver 2.51 and every case the edge refuses are
refused on tritonserver's own HTTP port, with the edge's answers, before it reads a byte of them; good requests (JSON,
binary, several on one connection, 100-continue) are served; the server's pid never changes."""

import gzip
import http.client
import json
import socket
import time

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of, start_digits, stop_digits
from tests.functional.test_edge import CRASHERS, DATA64, GOOD, TWO_READINGS
from tpserve.clients.infer import infer
from tpserve.common import endpoints

pytestmark = pytest.mark.functional
INFER = "/v2/models/digits_cnn/infer"


@pytest.fixture(scope="module")
def checked(digits_build, tmp_path_factory):
    root = tmp_path_factory.mktemp("checked")
    state_dir = start_digits(digits_build, root, "--max-request-mb", "8")
    yield endpoints.read_state(state_dir), root / "repo", state_dir
    stop_digits(state_dir)


def _http(state, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection(state.host, state.http_port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        found = {k.lower(): v for k, v in answer.getheaders()}
        return answer.status, found, answer.read()[:400].decode(errors="replace")
    finally:
        conn.close()


def _still_serving(checked) -> None:
    state, repo, state_dir = checked
    for protocol in ("http", "grpc"):
        out = infer(endpoint_of(state, repo, protocol), "digits_cnn", {"input": GOOD})
        assert out.outputs["logits"].shape == (1, 10)
    assert endpoints.read_state(state_dir).pid == state.pid, "tritonserver was restarted: a request crashed it"


@pytest.mark.parametrize("case", sorted(CRASHERS) + sorted(TWO_READINGS))
def test_a_request_that_cannot_be_valid_never_reaches_tritonserver(checked, case):
    state = checked[0]
    if case in CRASHERS:
        body = json.dumps({"inputs": CRASHERS[case]}).encode()
    else:
        body = TWO_READINGS[case].encode()
    model = "not_a_model" if "unknown" in case else "digits_cnn"
    status, headers, answer = _http(state, "POST", f"/v2/models/{model}/infer", body)
    assert status == 400 and headers.get("x-edge") == "refused" and "error" in answer, (status, answer)
    _still_serving(checked)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("DELETE", "/v2/models/digits_cnn", 405),
        ("POST", "/v2/models/digits_cnn/config", 405),
        ("GET", "/v2/models/%64igits_cnn/ready", 400),
        ("POST", "/v2/repository/models/../load", 400),
        ("GET", "/v2/repository/other/index", 404),
        ("POST", "/v2/models/digits_cnn/generate", 404),
        ("POST", "/v2/models/digits_cnn/generate_stream", 404),
    ],
)
def test_methods_and_paths_outside_the_allowlist_are_refused(checked, method, path, status):
    state = checked[0]
    got, headers, answer = _http(state, method, path, b"[" * 200_000 if "generate" in path else b"{}")
    assert got == status and headers.get("x-edge") == "refused", answer


def test_the_limits_hold_on_tritonserver_s_own_port(checked):
    state = checked[0]
    good = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]})
    assert _http(state, "POST", INFER, gzip.compress(good.encode()), {"Content-Encoding": "gzip"})[0] == 415
    assert _http(state, "GET", "/v2/health/ready", b"", {"X-Big": "a" * 20_000})[0] == 431
    assert _http(state, "POST", INFER, b"0" * (9 * 2**20))[0] == 413  # --max-request-mb 8
    assert _http(state, "POST", INFER, b"[" * 200_000)[0] == 400  # nested deeper than 32 levels
    params = "{" + ",".join(f'"p{i}":{i}' for i in range(77_000)) + "}"
    status, _, answer = _http(state, "POST", INFER, f'{{"parameters":{params},"inputs":[]}}'.encode())
    assert status == 400 and "more than 64 keys" in answer
    with socket.create_connection((state.host, state.http_port), timeout=60) as sock:  # chunked: send a length
        sock.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n".encode())
        assert sock.recv(200).startswith(b"HTTP/1.1 411")
    key = {"admin-key": state.admin_headers()["admin-key"]}
    files = json.dumps({"parameters": {"file:1/model.py": "aW1wb3J0IG9z"}}).encode()
    status, _, answer = _http(state, "POST", "/v2/repository/models/x/load", files, key)
    assert status == 403 and "cannot carry files" in answer
    _still_serving(checked)


def test_good_requests_pass_whole_and_in_order(checked):
    state, repo, _ = checked
    one = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]})
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(one)}\r\n\r\n{one}".encode()
    with socket.create_connection((state.host, state.http_port), timeout=60) as sock:  # pipelined, byte by byte
        for byte in request * 3:
            sock.send(bytes([byte]))
        answers = b""
        while answers.count(b"HTTP/1.1 200") < 3:
            answers += sock.recv(65536)
    with socket.create_connection((state.host, state.http_port), timeout=60) as sock:  # 100-continue, answered here
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {len(one)}\r\n\r\n".encode()
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100")
        sock.sendall(one.encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
    batch = np.random.default_rng(0).random((16, 1, 8, 8), dtype=np.float32)  # binary, over two reads
    out = infer(endpoint_of(state, repo, "http"), "digits_cnn", {"input": batch})
    assert out.outputs["logits"].shape == (16, 10)
    wrong = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [DATA64]}]})
    assert _http(state, "POST", INFER, wrong.encode())[0] == 400  # a string where numbers go: Triton's own 400


def test_a_head_that_never_ends_loses_its_connection(checked):
    """As at the edge: a head must arrive within 10 s of its first byte (slow senders cannot hold the connections)."""
    state = checked[0]
    with socket.create_connection((state.host, state.http_port), timeout=30) as sock:
        sock.sendall(f"POST {INFER} HT".encode())
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert 9.5 < time.monotonic() - started < 15
    _still_serving(checked)


# ---- gRPC on tritonserver's own port: a client's cancel, deadline or hang-up never cancels a call there ----

GRPC_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _model_infer_message() -> bytes:
    """A ModelInfer request for digits_cnn, gRPC-framed (a 5-byte prefix)."""
    import tritonclient.grpc.service_pb2 as pb

    request = pb.ModelInferRequest(model_name="digits_cnn")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(GOOD.shape))
    del tensor
    request.raw_input_contents.append(GOOD.astype(np.float32).tobytes())
    body = request.SerializeToString()
    return b"\0" + len(body).to_bytes(4, "big") + body


def _h2(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hang_ups(port: int, seconds: float, calls: int = 16) -> int:
    """Connections that send calls (some with a deadline) and hang up at once, by FIN or reset: how many."""
    import random
    import struct

    from hpack import Encoder

    message, made, end = _model_infer_message(), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        encoder, sent = Encoder(), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2(4, 0, 0)
        for i in range(calls):
            headers = GRPC_HEADERS + ([("grpc-timeout", "1m")] if i % 2 else [])
            sent += _h2(1, 4, 2 * i + 1, encoder.encode(headers)) + _h2(0, 1, 2 * i + 1, message)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            if random.random() < 0.5:  # a reset, not a FIN
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.sendall(sent)
            time.sleep(random.random() * 0.003)
        made += 1
    return made


def _breakers(port: int, seconds: float, calls: int = 8) -> int:
    """Connections that send calls, then a frame that would end the connection or reset a call (or random bytes),
    then more calls, and hang up a few milliseconds later: how many."""
    import random

    from hpack import Encoder

    from tests.unit.test_grpc_public_guard import BREAKERS

    message, made, end = _model_infer_message(), 0, time.monotonic() + seconds
    breakers = [b for name, b in sorted(BREAKERS.items()) if "longer than" not in name]
    while time.monotonic() < end:
        encoder, sent = Encoder(), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2(4, 0, 0)
        for i in range(calls):
            sent += _h2(1, 4, 2 * i + 1, encoder.encode(GRPC_HEADERS)) + _h2(0, 1, 2 * i + 1, message)
        bad = random.choice(breakers) if random.random() < 0.8 else random.randbytes(random.randrange(1, 64))
        later = _h2(1, 4, 2 * calls + 1, encoder.encode(GRPC_HEADERS)) + _h2(0, 1, 2 * calls + 1, message)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(sent)
            time.sleep(random.random() * 0.002)
            client.sendall(bad + later)
            time.sleep(random.random() * 0.004)
        made += 1
    return made


def _pingers(port: int, seconds: float, calls: int = 4) -> int:
    """Connections that send calls, then pings in a burst (gRPC ends a connection that pings too often, and with it
    the calls it runs, "too_many_pings"), and hang up soon after: how many."""
    import random

    from hpack import Encoder

    message, made, end = _model_infer_message(), 0, time.monotonic() + seconds
    while time.monotonic() < end:
        encoder, sent = Encoder(), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2(4, 0, 0)
        for i in range(calls):
            sent += _h2(1, 4, 2 * i + 1, encoder.encode(GRPC_HEADERS)) + _h2(0, 1, 2 * i + 1, message)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(sent)
            time.sleep(random.random() * 0.002)
            client.sendall(b"".join(_h2(6, 0, 0, b"%08d" % k) for k in range(8)))
            time.sleep(0.005)
        made += 1
    return made


def _deadlines(url: str, seconds: float, threads: int = 8) -> int:
    """Calls with deadlines of 0.2-3 ms, many expiring as the call completes: how many."""
    import random
    import threading

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    made = [0] * threads

    def run(index: int) -> None:
        with grpcclient.InferenceServerClient(url) as client:
            tensor = grpcclient.InferInput("input", list(GOOD.shape), "FP32")
            tensor.set_data_from_numpy(GOOD.astype(np.float32))
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    client.infer("digits_cnn", [tensor], client_timeout=0.0002 + random.random() * 0.003)
                except InferenceServerException:
                    pass  # DEADLINE_EXCEEDED, as asked
                made[index] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(made)


def test_grpc_clients_that_cancel_time_out_or_hang_up_crash_nothing(checked):
    from benchmarks.grpc_cancel import storm as cancel_storm

    state = checked[0]
    cancelled = cancel_storm(state.grpc_url, "digits_cnn", {"input": GOOD}, seconds=8, threads=8)
    timed_out = _deadlines(state.grpc_url, seconds=8)
    hung_up = _hang_ups(state.grpc_port, seconds=8)
    broke = _breakers(state.grpc_port, seconds=8)
    pinged = _pingers(state.grpc_port, seconds=8)
    print(
        f"gRPC at tritonserver's own port: {cancelled} cancelled, {timed_out} with deadlines, {hung_up} hang-ups, "
        f"{broke} connections breaking the protocol, {pinged} pinging in bursts"
    )
    assert cancelled > 200 and timed_out > 200 and hung_up > 50 and broke > 50 and pinged > 50
    time.sleep(2)  # what the hang-ups left running ends
    _still_serving(checked)


def test_a_call_carrying_the_servers_own_call_id_is_refused_on_grpc_and_stripped_on_http(checked):
    """x-edge-call is the id the guard gives each call (server/triton/front/call_ids.h): a gRPC call that brings its
    own is refused before tritonserver has its message (INVALID_ARGUMENT, saying why); over HTTP the header is left
    out of what tritonserver reads and the request is answered, and a body parameter of that name is refused (400,
    saying why). gRPC's request parameters are not read at the front: one of that name is answered (the model counts
    every id it is given: tests/unit/test_cancelled_calls.py). Nothing restarts."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    state, repo, _ = checked
    tensor = grpcclient.InferInput("input", list(GOOD.shape), "FP32")
    tensor.set_data_from_numpy(GOOD.astype(np.float32))
    with grpcclient.InferenceServerClient(state.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="x-edge-call is the server's own header") as refused:
            client.infer("digits_cnn", [tensor], headers={"x-edge-call": "00000000000000ff"}, client_timeout=30)
        assert "INVALID_ARGUMENT" in str(refused.value.status()), refused.value.status()
        assert client.infer("digits_cnn", [tensor], client_timeout=30).as_numpy("logits").shape == (1, 10)
    body = json.dumps({"inputs": [{"name": "input", "shape": list(GOOD.shape), "datatype": "FP32",
                                   "data": GOOD.astype(np.float32).ravel().tolist()}]}).encode()  # fmt: skip
    status, _, text = _http(state, "POST", INFER, body, {"x-edge-call": "00000000000000ff", "X-Edge-Call": "1"})
    assert status == 200, text
    own = json.dumps({"parameters": {"X-Edge-Call": "00000000000000ff"}, **json.loads(body)}).encode()
    status, _, text = _http(state, "POST", INFER, own)
    assert status == 400 and "the server's own" in text, text
    with grpcclient.InferenceServerClient(state.grpc_url) as client:  # a parameter the front does not read: answered
        answer = client.infer("digits_cnn", [tensor], parameters={"x-edge-call": "00000000000000ff"}, client_timeout=30)
        assert answer.as_numpy("logits").shape == (1, 10)
    _still_serving(checked)


WRONG_CALLS = {  # an input as sent over gRPC, and the words an HTTP request gets for it
    "datatype": (("input", [1, 1, 8, 8], "FP64"), "input 'input' has datatype FP64, the model takes FP32"),
    "shape": (("input", [1, 1, 8, 9], "FP32"), "input 'input' has shape [1,1,8,9], the model takes [batch]+[1,8,8]"),
    "batch": (("input", [65, 1, 8, 8], "FP32"), "input 'input' has batch 65, the model takes 1.."),
    "name": (("pixels", [1, 1, 8, 8], "FP32"), "input 'pixels' is not an input of digits_cnn"),
}


@pytest.mark.parametrize("case", sorted(WRONG_CALLS))
def test_a_wrong_grpc_call_is_refused_in_the_words_an_http_request_gets(checked, case):
    """A datatype, shape, batch or input name the model does not take is refused by the front before tritonserver
    holds the message, INVALID_ARGUMENT, in the same words as over HTTP (not tritonserver's own, '[request id:
    <id_unknown>] inference input ...'); the connection serves the next call."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    state, _, _ = checked
    (name, shape, datatype), words = WRONG_CALLS[case]
    wrong = grpcclient.InferInput(name, shape, datatype)
    wrong.set_data_from_numpy(np.zeros(shape, np.float64 if datatype == "FP64" else np.float32))
    good = grpcclient.InferInput("input", list(GOOD.shape), "FP32")
    good.set_data_from_numpy(GOOD.astype(np.float32))
    with grpcclient.InferenceServerClient(state.grpc_url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("digits_cnn", [wrong], client_timeout=30)
        assert words in str(refused.value) and "INVALID_ARGUMENT" in str(refused.value.status()), str(refused.value)
        assert client.infer("digits_cnn", [good], client_timeout=30).as_numpy("logits").shape == (1, 10)
    body = json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": datatype,
                                   "data": [0] * int(np.prod(shape))}]}).encode()  # fmt: skip
    status, _, text = _http(state, "POST", INFER, body)
    assert status == 400 and words in text, text
    _still_serving(checked)
