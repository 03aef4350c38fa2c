"""tritonserver's own surfaces behind Envoy (`make serve FRONT=envoy`), attacked as a local user, a client and a
key holder would (docs/security/red_team.md, findings 10-12): another user reaches neither of its internal
ports, no client crashes it by cancelling gRPC calls, and no one registers the Python backend's IPC memory.
Every test ends with the server's pid unchanged and requests served on both protocols."""

import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as system_shm
from tritonclient.utils import InferenceServerException

from benchmarks.grpc_cancel import storm as cancel_storm
from tests.functional.conftest import behind_edge
from tpserve.common import endpoints
from tpserve.server.single import start_single
from tpserve.server.stack import stop_stack
from tpserve.server.triton.processes import regions_of

pytestmark = pytest.mark.functional
ECHO = Path(__file__).parents[1] / "fixtures" / "edge_echo"
A = {"A": np.ones((1, 4), np.float32)}
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and an empty SETTINGS
RESERVED = "triton_python_backend"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    root = tmp_path_factory.mktemp("guarded")
    shutil.copytree(ECHO, root / "repo")
    settings = behind_edge(root / "repo", root / "state")
    start_single(settings)
    yield settings
    stop_stack(settings.state_dir)


def _inner(settings) -> endpoints.ServerState:
    return endpoints.read_state(settings.state_dir / "replica-0")


def _serves(settings, pid: int, drain_s: float = 0.0) -> None:
    """Both protocols answer through the edge and tritonserver is the one that was. After a cancel storm the edge
    may refuse new calls with a retry hint while the server still answers what nobody waits for: that is honoured
    (up to drain_s), as a client would, and the refusal must lift."""
    front = endpoints.read_state(settings.state_dir)
    for module, url in ((httpclient, front.http_url), (grpcclient, front.grpc_url)):
        with module.InferenceServerClient(url) as client:
            tensor = module.InferInput("A", [1, 4], "FP32")
            tensor.set_data_from_numpy(A["A"])
            assert _answer_after_hints(client, tensor, drain_s) == b"A:FP32:[1,4]"
    assert _inner(settings).pid == pid, "tritonserver was restarted: something reached it and crashed it"


def _answer_after_hints(client, tensor, drain_s: float) -> bytes:
    until = time.monotonic() + drain_s
    while True:
        try:
            return client.infer("echo", [tensor]).as_numpy("READ")[0]
        except InferenceServerException as err:
            if "retry after" not in str(err) or time.monotonic() > until:
                raise
            time.sleep(1.0)  # the hint: Retry-After 1 / grpc-retry-pushback-ms 1000


def _as_nobody(script: str) -> str:
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout.strip()


CHUNKS = """
import socket
s = socket.create_connection(("127.0.0.1", {port}), timeout=20)
head = b"POST /v2/models/echo/infer HTTP/1.1\\r\\nHost: x\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n"
try:
    s.sendall(head)
    for _ in range(200):
        s.sendall(b"1\\r\\n \\r\\n" * 10000)
    s.sendall(b"0\\r\\n\\r\\n")
    print("answer", repr(s.recv(100)))
except OSError as err:
    print("closed", type(err).__name__)
"""

ONE_BODY = """
import socket
s = socket.create_connection(("127.0.0.1", {port}), timeout=20)
try:
    s.sendall({data!r})
    print("answer", repr(s.recv(100)))
except OSError as err:
    print("closed", type(err).__name__)
"""

DUPLICATE_SHAPE = b'{"inputs":[{"name":"A","shape":[1,4],"shape":[1,2147483647],"datatype":"FP32","data":[1,1,1,1]}]}'


def _http_request(body: bytes) -> bytes:
    head = f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another local user (setpriv)")
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs /usr/bin/python3 for the other user")
def test_another_user_reaches_neither_internal_port(guarded):
    inner, pid = _inner(guarded), _inner(guarded).pid
    bodies = {
        "2,000,000 one-byte chunks": CHUNKS.format(port=inner.http_port),
        "a duplicated shape key": ONE_BODY.format(port=inner.http_port, data=_http_request(DUPLICATE_SHAPE)),
        "an HTTP/2 preface to gRPC": ONE_BODY.format(port=inner.grpc_port, data=PREFACE),
    }
    for case, script in bodies.items():
        said = _as_nobody(script)
        assert said.startswith("closed") or said == "answer b''", f"{case}: tritonserver answered: {said}"
    log = Path(inner.log).read_text(errors="replace")
    assert f"refused a connection to internal port {inner.http_port} from user 65534" in log
    assert f"refused a connection to internal port {inner.grpc_port} from user 65534" in log
    _serves(guarded, pid)


def test_the_edge_still_refuses_what_crashed_the_internal_port(guarded):
    front = endpoints.read_state(guarded.state_dir)
    connection = http.client.HTTPConnection("127.0.0.1", front.http_port, timeout=30)
    connection.request("POST", "/v2/models/echo/infer", body=DUPLICATE_SHAPE)
    answer = connection.getresponse()
    assert answer.status == 400 and "appears twice" in answer.read().decode()
    _serves(guarded, _inner(guarded).pid)


def test_cancelled_grpc_calls_crash_nothing(guarded):
    pid, front, inner = _inner(guarded).pid, endpoints.read_state(guarded.state_dir), _inner(guarded)
    through_edge = cancel_storm(front.grpc_url, "echo", A, seconds=10)
    straight = cancel_storm(inner.grpc_url, "echo", A, seconds=20)  # the guard's rewriting alone, no Envoy
    print(f"cancelled gRPC calls: {through_edge} through the edge, {straight} at tritonserver's own port")
    assert through_edge > 1000 and straight > 1000
    _serves(guarded, pid, drain_s=60.0)


def _backend_region(pid: int) -> str:
    regions = sorted(name for name in regions_of(pid) if name.startswith(RESERVED))
    assert regions, "the Python backend keeps its IPC in /dev/shm"
    return regions[0]


def _digest(region: str) -> str:
    return hashlib.sha256(Path("/dev/shm", region).read_bytes()).hexdigest()


def _clients(settings, state: endpoints.ServerState):
    key = Path(settings.state_dir / "admin_key").read_text().strip()
    return (
        ("http", httpclient.InferenceServerClient(state.http_url), {"admin-key": key}),
        ("grpc", grpcclient.InferenceServerClient(state.grpc_url), {"triton-grpc-protocol-admin-key": key}),
    )


def _attack(settings, region: str) -> None:
    """Register the backend's region as a client's and send an inference whose output goes there at offset 1024
    (the reproduction), over both protocols, through the edge and straight at tritonserver's ports."""
    for where in (endpoints.read_state(settings.state_dir), _inner(settings)):
        for protocol, client, key in _clients(settings, where):
            for name in (region, "/" + region):
                with pytest.raises(InferenceServerException) as refused:
                    client.register_system_shared_memory("stolen", name, 4096, headers=key)
                if where.http_port == endpoints.read_state(settings.state_dir).http_port:  # the edge says why
                    assert "the server's own memory" in str(refused.value) and region not in str(refused.value)
            tensor = (httpclient if protocol == "http" else grpcclient).InferRequestedOutput("READ")
            tensor.set_shared_memory("stolen", 40, offset=1024)  # where the reproduction wrote 40 bytes
            with pytest.raises(InferenceServerException):
                client.infer("echo", [], outputs=[tensor])
            client.close()


def test_the_backend_ipc_memory_cannot_be_registered_or_written(guarded):
    """The region also changes with the server's own traffic (the supervisor's probes, calls still computed after
    the cancel storm): the attack runs in a window with none, tried up to five times. A write the attack made
    would change it in every window."""
    pid = _inner(guarded).pid
    region = _backend_region(pid)
    changed = True
    for _ in range(5):
        before = _quiet_digest(region)
        _attack(guarded, region)
        changed = _digest(region) != before
        if not changed:
            break
    assert not changed, "a byte of the backend's IPC memory changed in every window"
    _serves(guarded, pid)


def _quiet_digest(region: str, timeout: float = 30.0) -> str:
    """The region's digest once it held still for half a second."""
    deadline, last = time.monotonic() + timeout, _digest(region)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _digest(region)
        if now == last:
            return now
        last = now
    return last


def test_a_clients_own_shared_memory_still_works_on_both_protocols(guarded):
    front = endpoints.read_state(guarded.state_dir)
    for protocol, client, key in _clients(guarded, front):
        name = f"/edge_test_{protocol}_{os.getpid()}"
        handle = system_shm.create_shared_memory_region(name[1:], name, 64)
        try:
            system_shm.set_shared_memory_region(handle, [A["A"]])
            client.register_system_shared_memory(name[1:], name, 64, headers=key)
            module = httpclient if protocol == "http" else grpcclient
            tensor = module.InferInput("A", [1, 4], "FP32")
            tensor.set_shared_memory(name[1:], 16)
            assert client.infer("echo", [tensor]).as_numpy("READ")[0] == b"A:FP32:[1,4]"
            client.unregister_system_shared_memory(name[1:], headers=key)
        finally:
            system_shm.destroy_shared_memory_region(handle)
            client.close()


def test_the_internal_ports_are_listed_as_internal(guarded):
    cluster = json.loads((guarded.state_dir / "cluster.json").read_text())
    inner, front = _inner(guarded), endpoints.read_state(guarded.state_dir)
    assert cluster["single"] and front.grpc_port == guarded.grpc_port != inner.grpc_port
    for port in (inner.http_port, inner.grpc_port):
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # this user (the edge's, the supervisor's) still connects


METRICS_CHUNKS = """
import socket
s = socket.create_connection(("127.0.0.1", {port}), timeout=30)
s.sendall(b"{method} /metrics HTTP/1.1\\r\\nHost: x\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n")
for _ in range(200):
    s.sendall(b"1\\r\\n \\r\\n" * 10000)
s.sendall(b"0\\r\\n\\r\\n")
print(s.recv(12).decode())
"""


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_public_metrics_port_takes_a_chunk_bomb_without_crashing(guarded, method):
    pid, metrics = _inner(guarded).pid, _inner(guarded).metrics_port
    said = subprocess.run(
        ["/usr/bin/python3", "-c", METRICS_CHUNKS.format(port=metrics, method=method)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert said.startswith("HTTP/1.1 " + ("200" if method == "GET" else "405")), said
    _serves(guarded, pid)


def test_the_state_folder_is_the_servers_alone(guarded):
    """Started from a library call under pytest's umask 022, the state folder is still 0700: its logs, records,
    sockets and key are reachable by this user only, whatever their own modes."""
    info = guarded.state_dir.stat()
    assert info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700
    assert (guarded.state_dir / "admin_key").stat().st_mode & 0o777 == 0o600


def test_make_soak_samples_the_server_its_stubs_its_supervisor_and_envoy(guarded):
    """STATE_DIR/server.json names the edge's ports; the soak samples the processes behind them."""
    from tpserve.loadtest.benches.soak import served_processes

    found, inner = served_processes(guarded.state_dir), _inner(guarded)
    cluster = json.loads((guarded.state_dir / "cluster.json").read_text())
    supervisor = json.loads((guarded.state_dir / "replica-0" / "supervisor.json").read_text())["pid"]
    assert found["tritonserver"] == inner.pid and found["echo #0"] != inner.pid
    assert found["supervisor"] == supervisor and found["envoy keeper"] == cluster["envoy_pid"]
    assert b"envoy" in Path(f"/proc/{found['envoy']}/cmdline").read_bytes()
