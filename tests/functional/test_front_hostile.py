"""The default front (the checks inside tritonserver's own reads) against a hostile client, over a real tritonserver
serving digits_cnn: frames tritonserver 2.51's gRPC would end a connection for (and cancel the calls it runs: its
crash) never reach it; no one connection wedges the bounds, while connected or after it left; a client's held
frames cost no memory past the budget; slow heads shut out nobody who sends a whole request; the health port tells
a keyless client only readiness. Each case runs for some seconds and ends with tritonserver's pid unchanged and an
ordinary client answered (tests/functional/hostile_grpc.py holds the attacks)."""

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.functional import hostile_grpc as hostile
from tests.functional.conftest import endpoint_of, start_digits, stop_digits
from tpserve.clients.infer import infer
from tpserve.common import endpoints

pytestmark = pytest.mark.functional
GOOD = np.zeros((1, 1, 8, 8), np.float32)
BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.0] * 64}]})
CRASH_SECONDS = 15  # the floor: 15 s of each case


@pytest.fixture(scope="module")
def front(digits_build, tmp_path_factory):
    root = tmp_path_factory.mktemp("front")
    state_dir = start_digits(digits_build, root, "--max-request-mb", "8")
    health_port = json.loads((state_dir / "supervisor.json").read_text())["health_port"]
    yield endpoints.read_state(state_dir), root / "repo", state_dir, health_port
    stop_digits(state_dir)


def _ordinary_http(state, timeout: float = 10) -> int:
    """An ordinary HTTP inference on a connection of its own: its status (0: no answer)."""
    conn = http.client.HTTPConnection(state.host, state.http_port, timeout=timeout)
    try:
        conn.request("POST", "/v2/models/digits_cnn/infer", body=BODY)
        answer = conn.getresponse()
        answer.read()
        return answer.status
    except OSError:
        return 0
    finally:
        conn.close()


def _unchanged(front) -> None:
    state, repo, state_dir, _ = front
    for protocol in ("http", "grpc"):
        assert infer(endpoint_of(state, repo, protocol), "digits_cnn", {"input": GOOD}).outputs["logits"].shape == (
            1,
            10,
        )
    assert endpoints.read_state(state_dir).pid == state.pid, "tritonserver was restarted: a client crashed it"
    log = (state_dir / "supervisor.log").read_text()
    assert "is gone" not in log, log[-2000:]


@pytest.mark.parametrize("case", sorted(hostile.CRASHERS))
def test_a_frame_grpc_would_end_the_connection_for_never_reaches_it_while_a_call_runs(front, case):
    """Case 1 of the front issue: size updates after a field or three at once, a PADDED HEADERS, unknown flags on a
    SETTINGS, a WINDOW_UPDATE or any frame, sent while a call runs: 15 s, no crash."""
    made = hostile.call_then(front[0].grpc_port, CRASH_SECONDS, hostile.CRASHERS[case], GOOD, "digits_cnn", "input")
    print(f"{case}: {made} connections")
    assert made > 100
    _unchanged(front)


def test_a_header_block_broken_off_after_its_first_frame_crashes_nothing(front):
    """Case 2: a call, then a HEADERS of 8-16 KiB without END_HEADERS sent in two parts, then a frame that is not its
    CONTINUATION, then a hang-up: the guard hands gRPC the HEADERS it decided on before it cuts, and ends the block."""
    made = hostile.broken_continuation(front[0].grpc_port, CRASH_SECONDS, GOOD, "digits_cnn", "input")
    print(f"broken header blocks: {made} connections")
    assert made > 100
    _unchanged(front)


def _answered_meanwhile(state, seconds: float) -> list[int]:
    end, statuses = time.monotonic() + seconds, []
    while time.monotonic() < end:
        statuses.append(_ordinary_http(state))
        time.sleep(0.25)
    return statuses


@pytest.mark.parametrize("attack", [hostile.window_zero, hostile.headers_only], ids=["window of 0", "headers only"])
def test_one_connection_never_wedges_the_bounds(front, attack):
    """Cases 3 and 4: 200 calls whose answers can never be written (SETTINGS_INITIAL_WINDOW_SIZE=0), or 200 streams
    opened with HEADERS only: ordinary clients are answered while it stays, and within 10 s after it left."""
    state = front[0]
    held = hostile.Held()
    try:
        attack(state.grpc_port, 200, GOOD, "digits_cnn", "input", held)
        time.sleep(1)
        during = _answered_meanwhile(state, 4)
    finally:
        held.close()
    after, left = None, time.monotonic()
    while time.monotonic() - left < 10 and after != 200:
        after = _ordinary_http(state, timeout=5)
    assert set(during) == {200}, during
    assert after == 200, f"refused {time.monotonic() - left:.1f} s after the attacker left"
    _unchanged(front)


def test_announcing_an_hpack_table_size_exempts_nobody_from_the_bounds(front):
    """Case 5: a connection with a table size of its own and 300 calls at once: past the waiting bound its calls are
    refused (a reset, REFUSED_STREAM: no header block of the guard's), never all served."""
    state = front[0]
    held = hostile.Held()
    try:
        hostile.resized_table(state.grpc_port, 300, GOOD, "digits_cnn", "input", held)
        got = hostile.answers_on(held.sockets[0], 3)
    finally:
        held.close()
    frames = hostile.server_frames(got)
    refused = [s for kind, _, s, payload in frames if kind == hostile.RST_STREAM and payload == (7).to_bytes(4, "big")]
    print(f"{len(refused)} of 300 calls refused")
    assert 100 < len(refused) < 300
    _unchanged(front)


def _rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_held_frames_cost_no_memory_past_the_budget_and_it_comes_back(front):
    """Case 6: 512 connections each holding all but the last byte of a 4 MiB DATA frame on a ModelStreamInfer stream:
    tritonserver's RSS rises by at most 1.1 GiB, and is within 128 MiB of where it began 10 s after they close."""
    state = front[0]
    before = _rss_mib(state.pid)
    held = hostile.Held()
    try:
        hostile.held_big_frames(state.grpc_port, 512, 4, held)
        peak = _rss_mib(state.pid)
        assert _ordinary_http(state) == 200
    finally:
        held.close()
    time.sleep(10)
    after = _rss_mib(state.pid)
    print(f"RSS {before:.0f} MiB, {peak:.0f} MiB with {len(held.sockets) or 512} frames held, {after:.0f} MiB after")
    assert peak - before <= 1.1 * 1024 and after - before <= 128
    _unchanged(front)


def test_a_grpc_message_over_the_limit_is_refused_at_the_front(front):
    """gRPC messages are capped by --max-request-mb (8 here) as HTTP bodies are: refused before tritonserver holds
    them, saying why."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    state = front[0]
    big = np.zeros((16, 1, 8, 8 * 2048), np.float32)  # 64 MiB
    tensor = grpcclient.InferInput("input", list(big.shape), "FP32")
    tensor.set_data_from_numpy(big)
    began = time.monotonic()
    with grpcclient.InferenceServerClient(state.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="over the edge's limit") as refused:
            client.infer("digits_cnn", [tensor], client_timeout=60)
    assert "RESOURCE_EXHAUSTED" in str(refused.value.status()), refused.value.status()
    print(f"a 64 MiB message refused in {time.monotonic() - began:.2f} s")
    _unchanged(front)


def _slow_heads(port: int, connections: int, stop: threading.Event, opened: list) -> None:
    """Holds `connections` HTTP connections, each sending a partial head and one more byte every 4 s, reopening
    those the front closes."""
    held: list[socket.socket] = []
    try:
        while not stop.is_set():
            while len(held) < connections and not stop.is_set():
                try:
                    client = socket.create_connection(("127.0.0.1", port), timeout=2)
                    client.sendall(b"POST /v2/models/digits_cnn/infer HTTP/1.1\r\nHost: x\r\n")
                    held.append(client)
                    opened[0] += 1
                except OSError:
                    time.sleep(0.05)
            time.sleep(1)
            for client in list(held):
                try:
                    client.sendall(b"X")
                except OSError:
                    held.remove(client)
                    client.close()
    finally:
        for client in held:
            client.close()


def test_slow_heads_on_every_slot_shut_out_nobody_who_sends_a_whole_request(front):
    """Case 7: one client holds 1,100 HTTP connections with trickling heads (the front's cap is 1,024), reopening
    those cut: at least 19 of 20 ordinary requests on new connections are answered."""
    state, stop, opened = front[0], threading.Event(), [0]
    attacker = threading.Thread(target=_slow_heads, args=(state.http_port, 1100, stop, opened), daemon=True)
    attacker.start()
    try:
        time.sleep(8)
        statuses = []
        for _ in range(20):
            statuses.append(_ordinary_http(state, timeout=10))
            time.sleep(0.5)
    finally:
        stop.set()
        attacker.join(timeout=60)
    print(f"slow heads: {opened[0]} connections opened; ordinary requests: {statuses}")
    assert opened[0] >= 1024 and statuses.count(200) >= 19, statuses
    _unchanged(front)


def test_the_health_port_tells_a_keyless_client_only_readiness(front):
    """Case 8: /status (pids, restart causes, log tails) is 403 without the key; readiness answers anyone."""
    _, _, state_dir, health_port = front
    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/v2/health/ready", timeout=5) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{health_port}/status", timeout=5)
    assert refused.value.code == 403
    key = (state_dir / "admin_key").read_text().strip()
    request = urllib.request.Request(f"http://127.0.0.1:{health_port}/status", headers={"admin-key": key})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert "restarts" in json.loads(response.read())
