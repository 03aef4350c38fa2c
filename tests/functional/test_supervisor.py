"""The supervised embedded server heals itself: a killed stub, a killed tritonserver, readiness that tells the truth."""

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of
from tpserve.builders.build import build_model
from tpserve.builders.repository.writer import ServingOptions
from tpserve.builders.request import BuildRequest
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.common.errors import ServerError
from tpserve.server.supervision import supervisor_process
from tpserve.server.supervision.probes import ProbeSettings
from tpserve.server.supervision.supervisor_process import stop_supervisor
from tpserve.server.triton import launcher, processes
from tpserve.server.triton.processes import stub_pids

pytestmark = pytest.mark.functional
RECOVERY_FLOOR_S = 10.0
PROBES = ProbeSettings(interval=1.0, timeout=2.0, threshold=3)


@pytest.fixture()
def supervised(digits_build, tmp_path, request):
    spec, built, _ = digits_build
    options = ServingOptions(instances=getattr(request, "param", 2))
    build_model(
        BuildRequest(spec=spec, target="embedded", repo=tmp_path / "repo", work_dir=tmp_path / "work", options=options),
        built,
    )
    http_port, grpc_port, metrics_port, health_port = endpoints.free_ports(4)
    settings = launcher.ServerSettings(
        tmp_path / "repo",
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        state_dir=tmp_path / "state",
    )
    start_supervised(settings, health_port, probes=PROBES)
    yield settings, health_port
    stop_supervisor(settings.state_dir)
    launcher.stop(settings.state_dir)


def _health(port: int, path: str = "/v2/health/ready") -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def _load(settings, stop: threading.Event, protocol: str, log: list) -> None:
    """Bounded closed-loop load: one request at a time, each recorded as (start, end, ok)."""
    ep = endpoint_of(endpoints.read_state(settings.state_dir), settings.repo, protocol)
    x = np.zeros((1, 1, 8, 8), np.float32)
    while not stop.is_set():
        started = time.monotonic()
        try:
            infer(ep, "digits_cnn", {"input": x})
            ok = True
        except Exception:
            ok = False
        log.append((started, time.monotonic(), ok))
        time.sleep(0.01)


def _poll_health(port: int, stop: threading.Event, seen: list) -> None:
    while not stop.is_set():
        seen.append((time.monotonic(), _health(port, "/v2/models/digits_cnn/ready")))
        time.sleep(0.05)


def _events(port: int) -> list:
    return _status(port)["events"]


def _gone(pid: int) -> bool:
    try:
        return not open(f"/proc/{pid}/cmdline", "rb").read()  # empty: a zombie
    except OSError:
        return True


@pytest.mark.chaos  # 2 of 7 runs saw one late failure ~12 s after the kill (cause not found): not in CI yet
def test_a_killed_stub_is_reloaded_within_the_floor_and_only_that_window_fails(supervised):
    settings, health_port = supervised
    stop, logs, seen = threading.Event(), {"http": [], "grpc": []}, []
    threads = [threading.Thread(target=_load, args=(settings, stop, p, logs[p])) for p in logs]
    threads.append(threading.Thread(target=_poll_health, args=(health_port, stop, seen)))
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    server_pid = endpoints.read_state(settings.state_dir).pid
    victim = min(stub_pids(server_pid)["digits_cnn"])
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    time.sleep(RECOVERY_FLOOR_S + 2)
    stop.set()
    for thread in threads:
        thread.join(30)
    requests = logs["http"] + logs["grpc"]
    failed = [r for r in requests if not r[2]]
    # The window: from the kill to the end of the last failed request (the other instance may serve meanwhile).
    window_end = max((end for _, end, _ in failed), default=killed)
    print(f"stub kill: {len(failed)} of {len(requests)} requests failed, all within {window_end - killed:.2f} s")
    print("failures at", [round(start - killed, 2) for start, _, _ in failed], _events(health_port))
    assert window_end - killed < RECOVERY_FLOOR_S
    assert all(start >= killed - 1.0 for start, _, _ in failed), "a failure before the kill"
    assert sum(ok for start, _, ok in requests if start > window_end) >= 10, "too few served after the window"
    assert 503 in {code for _, code in seen}, "readiness never said the model was down"
    assert seen[-1][1] == 200
    assert set(stub_pids(server_pid)["digits_cnn"]).isdisjoint({victim})


def test_a_killed_server_is_restarted_on_the_same_ports_and_stop_ends_everything(supervised):
    settings, health_port = supervised
    old = endpoints.read_state(settings.state_dir)
    os.kill(old.pid, signal.SIGKILL)
    deadline, down_seen = time.monotonic() + 120, False
    while time.monotonic() < deadline:
        down_seen |= _health(health_port) == 503
        if down_seen and _health(health_port) == 200:
            break
        time.sleep(0.1)
    assert down_seen and _health(health_port) == 200
    new = endpoints.read_state(settings.state_dir)
    assert new.pid != old.pid and (new.http_port, new.grpc_port) == (old.http_port, old.grpc_port)
    ep = endpoint_of(new, settings.repo, "grpc")
    assert infer(ep, "digits_cnn", {"input": np.zeros((2, 1, 8, 8), np.float32)}).outputs["logits"].shape == (2, 10)
    events = [what for _, what in _events(health_port)]
    assert any("restarted" in e for e in events), events
    supervisor_pid = json.loads((settings.state_dir / "supervisor.json").read_text())["pid"]
    assert stop_supervisor(settings.state_dir)
    assert not processes.is_tritonserver(new.pid) and _gone(supervisor_pid)
    assert _health(health_port) == 0  # nothing answers any more


def test_a_second_start_from_a_supervised_state_dir_is_refused_and_stop_still_ends_the_first(supervised):
    """Seen on a GPU host: a bench started again on the state dir of one still running lost the running
    supervisor's record (its start removed it before the supervisor refused), so `server stop` ended tritonserver
    alone, said "stopped", and the supervisor started it again. Now the second start is refused before anything is
    touched, whether it comes as `server start` does or as the benches do, also while the supervisor is between
    two tritonservers; and stop ends both."""
    from tpserve.server.__main__ import stop_everything
    from tpserve.server.fronts import served_as_started

    settings, health_port = supervised
    folder = settings.state_dir
    record = (folder / "supervisor.json").read_text()
    supervisor_pid = json.loads(record)["pid"]
    others = dict(zip(("http_port", "grpc_port", "metrics_port"), endpoints.free_ports(3)))
    second = launcher.ServerSettings(settings.repo, **others, state_dir=folder)
    with pytest.raises(ServerError, match=rf"a server started from {folder} is running \(its supervisor, pid "):
        start_supervised(second, endpoints.free_ports(1)[0])
    with pytest.raises(ServerError, match="make stop STATE_DIR="):
        with served_as_started(settings.repo, folder):
            pass
    os.kill(endpoints.read_state(folder).pid, signal.SIGKILL)  # the supervisor alone runs until it restarts it
    with pytest.raises(ServerError, match="its supervisor, pid"):
        launcher.start(second)
    assert (folder / "supervisor.json").read_text() == record
    _ready_again(health_port)
    assert "stopped" in stop_everything(folder)
    assert _gone(supervisor_pid)
    time.sleep(3)  # a supervisor left running would have started its tritonserver again by now
    assert launcher.running_from(folder) is None


def _ready_again(health_port: int, within_s: float = 120, after_down: bool = False) -> None:
    """Until the readiness port answers 200 (after_down: once it has answered something else first)."""
    deadline, down = time.monotonic() + within_s, not after_down
    while time.monotonic() < deadline:
        code = _health(health_port)
        down |= code != 200
        if down and code == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"not ready again within {within_s} s")


@pytest.mark.parametrize("crash", [signal.SIGSEGV, signal.SIGKILL], ids=["segfault", "killed"])
def test_the_stubs_a_dead_server_left_are_ended_before_it_is_restarted(tmp_path, crash):
    """Seen after tritonserver crashes under load: its Python-backend stubs, busy in a call when it died, ran on
    for an hour with their memory and shared memory, and SIGTERM did not end them (an idle stub notices its
    parent's end and exits). The supervisor ends them before it restarts the server, and says so."""
    import shutil

    shutil.copytree(SLOW_MODEL, tmp_path / "repo")
    http_port, grpc_port, metrics_port, health_port = endpoints.free_ports(4)
    settings = launcher.ServerSettings(
        tmp_path / "repo", http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, state_dir=tmp_path / "s"
    )
    start_supervised(settings, health_port, probes=PROBES)
    stop = threading.Event()
    try:
        old = endpoints.read_state(settings.state_dir)
        left = stub_pids(old.pid)["slow"]
        ep = endpoint_of(old, settings.repo, "http")

        def busy() -> None:
            while not stop.is_set():
                try:
                    infer(ep, "slow", {"X": np.ones((1, 1), np.float32)})
                except Exception:  # refused, or the server is gone
                    time.sleep(0.05)

        workers = [threading.Thread(target=busy) for _ in range(4)]
        for worker in workers:
            worker.start()
        time.sleep(1.5)  # the stub is inside a call
        os.kill(old.pid, crash)
        _ready_again(health_port, after_down=True)
        stop.set()
        for worker in workers:
            worker.join()
        assert all(_gone(pid) for pid in left), [p for p in left if not _gone(p)]
        events = [what for _, what in _events(health_port)]
        assert any("Python-backend stubs the dead tritonserver left running" in e for e in events), events
    finally:
        stop.set()
        stop_supervisor(settings.state_dir)
        launcher.stop(settings.state_dir)


def test_deeply_nested_json_crashes_tritonserver_and_the_supervisor_brings_it_back(supervised):
    """tritonserver 2.51's HTTP frontend dies on 200,000 nested '[' (its JSON parser recurses): a denial of
    service by one request. Pinned here; the supervisor is what keeps the service up."""
    import http.client

    settings, health_port = supervised
    old = endpoints.read_state(settings.state_dir)
    conn = http.client.HTTPConnection(old.host, old.http_port, timeout=30)
    sent = time.monotonic()
    try:
        conn.request("POST", "/v2/models/digits_cnn/infer", body=b"[" * 200_000)
        conn.getresponse()
    except (http.client.HTTPException, OSError):
        pass  # the connection dies with the server
    finally:
        conn.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = endpoints.read_state(settings.state_dir)
        if state.pid != old.pid and _health(health_port) == 200:
            break
        time.sleep(0.2)
    assert endpoints.read_state(settings.state_dir).pid != old.pid, "tritonserver survived: unpin this test"
    print(f"nested JSON on the internal port: tritonserver crashed, ready again {time.monotonic() - sent:.1f} s later")
    (restart,) = _status(health_port)["restarts"]
    assert "exited on its own" in restart["reason"] and restart["exit"] != "status unknown"
    ep = endpoint_of(endpoints.read_state(settings.state_dir), settings.repo, "http")
    assert infer(ep, "digits_cnn", {"input": np.zeros((1, 1, 8, 8), np.float32)}).outputs["logits"].shape == (1, 10)


@pytest.mark.parametrize("supervised", [1], indirect=True)
def test_a_wedged_stub_is_found_by_the_probes_and_the_model_reloaded(supervised):
    """SIGSTOP leaves every process alive and Triton calling the model ready, while nothing answers."""
    settings, health_port = supervised
    state = endpoints.read_state(settings.state_dir)
    ep = endpoint_of(state, settings.repo, "http")
    (victim,) = stub_pids(state.pid)["digits_cnn"]
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        deadline, answered = stopped + 90, None
        while time.monotonic() < deadline and answered is None:
            try:
                with ep.client(network_timeout=3.0) as client:
                    x = np.zeros((1, 1, 8, 8), np.float32)
                    answered = infer(ep, "digits_cnn", {"input": x}, client=client).outputs["logits"].shape
            except Exception:
                time.sleep(0.5)
    finally:
        os.kill(victim, signal.SIGCONT)  # a no-op for the SIGKILLed stub; frees it if the probes missed it
    print(f"wedged stub: served again {time.monotonic() - stopped:.1f} s after the SIGSTOP")
    assert answered == (1, 10)
    events = [what for _, what in _events(health_port)]
    assert any("probes in a row got no answer" in e for e in events), events
    assert sum("reloading" in e for e in events) == 1, events  # one reload, no cascade
    _await(lambda: victim not in stub_pids(state.pid).get("digits_cnn", set()), 15)  # retired after the reload


KEYS: dict[int, Path] = {}  # health port -> its server's admin key file: /status is the key holder's


def start_supervised(settings, health_port: int, **options):
    KEYS[health_port] = settings.state_dir / "admin_key"
    supervisor_process.start_supervised(settings, health_port, **options)


def _status(port: int) -> dict:
    key = KEYS[port].read_text().strip()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/status", headers={"admin-key": key})
    with urllib.request.urlopen(request, timeout=2) as response:
        return json.loads(response.read())


def test_a_frozen_server_turns_not_ready_fast_and_is_restarted_with_its_evidence(supervised):
    settings, health_port = supervised
    old = endpoints.read_state(settings.state_dir)
    log_before = Path(old.log).read_text()
    os.kill(old.pid, signal.SIGSTOP)
    frozen, not_ready_after, back_after = time.monotonic(), None, None
    try:
        while time.monotonic() - frozen < 60 and back_after is None:
            code = _health(health_port)
            if code != 200 and not_ready_after is None:
                not_ready_after = time.monotonic() - frozen
            if not_ready_after is not None and code == 200:
                back_after = time.monotonic() - frozen
            time.sleep(0.05)
    finally:
        try:
            os.kill(old.pid, signal.SIGCONT)  # a no-op once it was killed
        except ProcessLookupError:
            pass
    print(f"frozen server: not ready after {not_ready_after:.2f} s, serving again after {back_after:.1f} s")
    # The goals (503 within 2 s, serving again within 10 s) are measured figures (README); the assertions leave room
    # for a busy host: what must hold is that a freeze is noticed and healed at all, in seconds, not minutes.
    assert not_ready_after is not None and not_ready_after <= 2 * 2.0
    assert back_after is not None and back_after <= 3 * RECOVERY_FLOOR_S
    new = endpoints.read_state(settings.state_dir)
    assert new.pid != old.pid
    (restart,) = _status(health_port)["restarts"]
    assert restart["pid"] == old.pid and "SIGKILL" in restart["exit"] and "frozen" in restart["reason"]
    assert restart["log_tail"]
    assert Path(new.log).read_text().startswith(log_before)  # appended, never truncated
    supervisor_log = (settings.state_dir / "supervisor.log").read_text()
    assert f"tritonserver (pid {old.pid}) is gone: killed by signal 9" in supervisor_log


def test_a_crash_leaves_no_shared_memory_behind(supervised):
    settings, health_port = supervised
    old = endpoints.read_state(settings.state_dir)
    mine = _regions_of(old.pid)  # other tests' servers have regions of their own: only this server's count
    assert mine and all((p.stat().st_mode & 0o777) == 0o600 for p in mine)  # private: see the README
    os.killpg(old.pid, signal.SIGKILL)  # the server and its stubs: nothing unmaps its regions
    _await(lambda: endpoints.read_state(settings.state_dir).pid != old.pid and _health(health_port) == 200, 60)
    _await(lambda: not any(p.exists() for p in mine), 15)  # removed once the new server is up
    new = _regions_of(endpoints.read_state(settings.state_dir).pid)
    assert new and not (new & mine)
    stop_supervisor(settings.state_dir)
    assert not any(p.exists() for p in new), "regions left after stop"


def _regions_of(server_pid: int) -> set[Path]:
    """The Python-backend regions that a server (or one of its stubs) maps."""
    pids = [server_pid, *[pid for pids in stub_pids(server_pid).values() for pid in pids]]
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        found |= {
            Path("/dev/shm") / line.split("/dev/shm/", 1)[1].split(" (deleted)")[0]
            for line in maps.splitlines()
            if "/dev/shm/triton_python_backend" in line
        }
    return found


def _await(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.2)
    assert condition()


@pytest.mark.parametrize("supervised", [1], indirect=True)
def test_an_unload_through_the_admin_api_is_respected_until_a_load(supervised):
    settings, health_port = supervised
    state = endpoints.read_state(settings.state_dir)
    with endpoint_of(state, settings.repo, "http").client() as client:
        client.unload_model("digits_cnn", headers=state.admin_headers())
        # the supervisor sees the unload once the stub has exited: on a busy host that is more than one round
        _await(lambda: "digits_cnn" in _status(health_port)["unloaded"], 60)
        time.sleep(3.0)  # several supervisor rounds after it saw the unload
        assert not client.is_model_ready("digits_cnn"), "the supervisor reloaded a model unloaded on purpose"
        assert "digits_cnn" in _status(health_port)["unloaded"]
        client.load_model("digits_cnn", headers=state.admin_headers())
    _await(lambda: "digits_cnn" in _status(health_port)["models"], 10)
    victim = min(stub_pids(state.pid)["digits_cnn"])
    os.kill(victim, signal.SIGKILL)  # watched again: a crash after the load is healed
    _await(lambda: any("digits_cnn: reloaded" in what for _, what in _events(health_port)), 30)
    _await(lambda: _health(health_port) == 200, 30)


def test_the_readiness_port_bounds_its_connections(supervised):
    import socket

    settings, health_port = supervised
    supervisor_pid = json.loads((settings.state_dir / "supervisor.json").read_text())["pid"]
    held = [socket.create_connection(("127.0.0.1", health_port), timeout=5) for _ in range(200)]
    try:
        for sock in held:
            sock.send(b"GET /v2/health/ready HTTP/1.1\r\n")  # half a request, never finished
        time.sleep(1.0)
        threads = len(os.listdir(f"/proc/{supervisor_pid}/task"))
        assert threads < 80, f"{threads} threads for 200 half-sent requests"
    finally:
        for sock in held:
            sock.close()
    _await(lambda: _health(health_port) == 200, 15)


@pytest.mark.parametrize("supervised", [1], indirect=True)
def test_a_failed_reload_is_retried_with_backoff_and_only_that_model_reads_not_ready(supervised):
    settings, health_port = supervised
    state = endpoints.read_state(settings.state_dir)
    model_py = settings.repo / "digits_cnn" / "1" / "model.py"
    good = model_py.read_text()
    model_py.write_text('raise RuntimeError("broken on purpose by the test")\n' + good)
    try:
        os.kill(min(stub_pids(state.pid)["digits_cnn"]), signal.SIGKILL)
        _await(lambda: "digits_cnn" in _status(health_port)["broken"], 60)
        assert _health(health_port) == 200, "one broken model made the whole server read not ready"
        assert _health(health_port, "/v2/models/digits_cnn/ready") == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/v2/health/ready", timeout=2) as answer:
            assert "broken on purpose" in json.loads(answer.read())["models_not_ready"]["digits_cnn"]
        _await(lambda: _status(health_port)["broken"].get("digits_cnn", {}).get("attempts", 0) >= 2, 30)  # retried
    finally:
        model_py.write_text(good)
    _await(lambda: _health(health_port, "/v2/models/digits_cnn/ready") == 200, 60)  # healed by a later retry
    assert "digits_cnn" not in _status(health_port)["broken"]
    ep = endpoint_of(endpoints.read_state(settings.state_dir), settings.repo, "grpc")
    assert infer(ep, "digits_cnn", {"input": np.zeros((1, 1, 8, 8), np.float32)}).outputs["logits"].shape == (1, 10)


def test_slow_clients_cannot_hold_the_readiness_port(supervised):
    """300 sockets each trickling a byte every 1.5 s: a new client is still answered at once, every round."""
    import socket

    _, health_port = supervised
    held = [socket.create_connection(("127.0.0.1", health_port), timeout=5) for _ in range(300)]
    try:
        for _ in range(3):
            for sock in held:
                try:
                    sock.send(b"G")
                except OSError:  # closed by the server: its whole request took too long
                    pass
            started = time.monotonic()
            assert _health(health_port) == 200
            assert time.monotonic() - started < 1.0
            time.sleep(1.5)
    finally:
        for sock in held:
            sock.close()


def test_a_model_that_stays_broken_for_many_retry_rounds_keeps_the_supervisor_bounded(digits_build, tmp_path):
    """A model whose file raises at every load, retried every 0.05 s (a month of 30 s retries, compressed): the
    supervisor keeps the last KEEP_EVENTS events, counts the rest, /status stays small, its memory flat, and the
    other readiness answers stay true throughout."""
    from tpserve.loadtest.benches.soak import rss_mib
    from tpserve.server.supervision.supervisor import KEEP_EVENTS, STATE, RetrySettings

    spec, built, _ = digits_build
    request = BuildRequest(
        spec=spec, target="embedded", repo=tmp_path / "repo", work_dir=tmp_path / "work", options=ServingOptions()
    )
    build_model(request, built)
    http_port, grpc_port, metrics_port, health_port = endpoints.free_ports(4)
    settings = launcher.ServerSettings(
        tmp_path / "repo", http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, state_dir=tmp_path / "s"
    )
    start_supervised(settings, health_port, probes=PROBES, retry=RetrySettings(first_s=0.05, max_s=0.05))
    supervisor = json.loads((settings.state_dir / STATE).read_text())["pid"]
    model_py = settings.repo / "digits_cnn" / "1" / "model.py"
    model_py.write_text('raise RuntimeError("broken on purpose, for good")\n' + model_py.read_text())
    try:
        os.kill(min(stub_pids(endpoints.read_state(settings.state_dir).pid)["digits_cnn"]), signal.SIGKILL)
        _await(lambda: _status(health_port)["broken"].get("digits_cnn", {}).get("attempts", 0) >= 20, 120)
        early, rounds = rss_mib(supervisor), KEEP_EVENTS // 2 + 20  # two events a round: past the kept ones
        _await(lambda: _status(health_port)["broken"]["digits_cnn"]["attempts"] >= rounds, 600)
        status, late = _status(health_port), rss_mib(supervisor)
        assert len(status["events"]) == KEEP_EVENTS and status["events_total"] >= 2 * rounds
        assert len(json.dumps(status)) < 64 * 1024, "/status grew with the rounds"
        assert late - early < 16, f"the supervisor grew {late - early:.1f} MiB over {rounds - 20} retry rounds"
        assert _health(health_port) == 200 and _health(health_port, "/v2/models/digits_cnn/ready") == 503
        size = len(json.dumps(status))
        print(f"\n{rounds} retry rounds: supervisor RSS {early:.1f} -> {late:.1f} MiB, /status {size} B")
    finally:
        stop_supervisor(settings.state_dir)
        launcher.stop(settings.state_dir)


SLOW_MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "slow_model"


def test_a_model_busy_under_a_flood_is_not_taken_for_a_hung_one(tmp_path):
    """A flood keeps a slow model's bounded queue full for seconds: its probes time out or are refused, yet it
    runs batches all along, so the supervisor reloads nothing and tritonserver and the stub keep their pids."""
    import shutil

    shutil.copytree(SLOW_MODEL, tmp_path / "repo")
    http_port, grpc_port, metrics_port, health_port = endpoints.free_ports(4)
    settings = launcher.ServerSettings(
        tmp_path / "repo", http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, state_dir=tmp_path / "s"
    )
    start_supervised(settings, health_port, probes=ProbeSettings(interval=1.0, timeout=1.0, threshold=2))
    try:
        state = endpoints.read_state(settings.state_dir)
        stubs = stub_pids(state.pid)["slow"]
        ep = endpoint_of(state, settings.repo, "http")
        stop, answered = threading.Event(), []

        def flood() -> None:
            while not stop.is_set():
                try:
                    infer(ep, "slow", {"X": np.ones((1, 1), np.float32)})
                    answered.append(1)
                except Exception:  # refused: the queue is full
                    time.sleep(0.01)

        workers = [threading.Thread(target=flood) for _ in range(24)]
        for worker in workers:
            worker.start()
        time.sleep(12)  # six probe rounds, two misses in a row reload a hung model
        stop.set()
        for worker in workers:
            worker.join()
        events = [what for _, what in _events(health_port)]
        assert answered, "the flood got no answer at all"
        assert not any("reloading" in e for e in events), events
        assert endpoints.read_state(settings.state_dir).pid == state.pid
        assert stub_pids(state.pid)["slow"] == stubs
        assert infer(ep, "slow", {"X": np.ones((1, 1), np.float32)}).outputs["Y"].shape == (1, 1)
    finally:
        stop_supervisor(settings.state_dir)
        launcher.stop(settings.state_dir)
