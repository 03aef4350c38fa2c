"""gRPC ModelStreamInfer is refused by default, on both fronts: tritonserver 2.51 crashes (SIGSEGV in the Python
backend, reading a freed request) under concurrent streams whose requests overlap, whoever the client is
(docs/security.md). Each stream gets UNIMPLEMENTED with the reason before tritonserver reads a request of it, unary
calls are served as before, and a storm of raw stream clients leaves the server's pid as it was."""

import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hpack import Encoder
from tritonclient.grpc import service_pb2

from tpserve.common import endpoints

SLOW = Path(__file__).resolve().parent.parent / "fixtures" / "slow_model"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
FRONTS = {"envoy": ("--front", "envoy"), "the default (checks in the server)": ()}


@pytest.fixture(scope="module", params=sorted(FRONTS))
def served(request, tmp_path_factory):
    """The slow model served as `server start` does (through Envoy) or with the checks in tritonserver."""
    root = tmp_path_factory.mktemp("streaming")
    shutil.copytree(SLOW, root / "repo")
    ports = [str(p) for p in endpoints.free_ports(4)]
    command = [sys.executable, "-m", "tpserve.server", "start", *FRONTS[request.param], "--repo", str(root / "repo"),
               "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2],
               "--health-port", ports[3], "--state-dir", str(root / "state")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    state_dir = root / "state"
    yield state_dir, endpoints.read_state(state_dir)
    subprocess.run([sys.executable, "-m", "tpserve.server", "stop", "--state-dir", str(state_dir)], timeout=120)


def _pid(state_dir: Path) -> int:
    served = state_dir / "replica-0"  # behind the edge: the server's own state
    return endpoints.read_state(served if served.is_dir() else state_dir).pid


def _tensor() -> grpcclient.InferInput:
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    return x


def test_a_stream_is_refused_with_why_and_unary_calls_are_served(served):
    _, state = served
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(state.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        try:
            client.async_stream_infer("slow", [_tensor()])
        except Exception:  # the edge refuses at the stream's headers: the client library knows it by the send
            pass
        refusal = answers.get(timeout=30)
        client.stop_stream()
        assert client.infer("slow", [_tensor()]).as_numpy("Y").tolist() == [[1.0]]
    assert "UNIMPLEMENTED" in str(refusal.status()), refusal
    assert "ModelStreamInfer is not served here" in refusal.message() and "2.51" in refusal.message()


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _raw_stream(port: int, message: bytes, messages: int) -> None:
    """A raw HTTP/2 client: a stream of overlapping requests, its end, a short wait, then it hangs up unread."""
    block = Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", STREAM_PATH), (":authority", "x"),
                              ("content-type", "application/grpc"), ("te", "trailers")])  # fmt: skip
    sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0) + _frame(1, 4, 1, block)
    sent += b"".join(_frame(0, 0, 1, message) for _ in range(messages)) + _frame(0, 1, 1)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(sent)
            time.sleep(0.05)
    except OSError:
        pass  # refused while a server restarts: the pid says so


def test_a_storm_of_overlapping_streams_takes_nothing_down(served):
    """What crashed tritonserver 2.51 within a minute on either front: 12 clients opening streams of 20 requests."""
    state_dir, state = served
    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="X", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones((1, 1), np.float32).tobytes())
    body = request.SerializeToString()
    message = b"\0" + len(body).to_bytes(4, "big") + body
    port, before = state.grpc_port, _pid(state_dir)

    def client() -> None:
        for _ in range(40):
            _raw_stream(port, message, 20)

    workers = [threading.Thread(target=client) for _ in range(12)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    time.sleep(2)
    assert _pid(state_dir) == before, "tritonserver was restarted during the storm"
    with grpcclient.InferenceServerClient(state.grpc_url) as client:
        assert client.infer("slow", [_tensor()]).as_numpy("Y").tolist() == [[1.0]]


def test_our_client_says_why_and_how_to_serve_streams(served):
    from tpserve.clients.streaming import stream_infer
    from tpserve.common.errors import ClientError

    _, state = served
    with pytest.raises(ClientError, match="UNIMPLEMENTED.*not served here.*GRPC_STREAMING=1"):
        stream_infer(state.endpoint("grpc"), "slow", {"X": np.ones((1, 1), np.float32)}, timeout=30)
