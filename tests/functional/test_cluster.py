"""Two supervised replicas behind a real Envoy: routing on HTTP and gRPC, locked admin APIs, a replica
SIGKILLed under load, a rolling restart under load, and `stop` leaving no process behind."""

import json
import os
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from benchmarks.grpc_cancel import storm as cancel_storm
from tests.functional.conftest import endpoint_of
from tests.functional.load import ClosedLoop
from tpserve.builders.build import build_model
from tpserve.builders.repository.writer import ServingOptions
from tpserve.builders.request import BuildRequest
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.server.cluster import ClusterSettings, start_cluster
from tpserve.server.edge.envoy_config import Balancing
from tpserve.server.edge.front import admin_socket, host_health
from tpserve.server.stack import read_stack, replica_restarted, restart_replicas, stop_stack
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional
X = np.zeros((1, 1, 8, 8), np.float32)


@pytest.fixture(scope="module")
def cluster(digits_build, tmp_path_factory):
    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("cluster")
    build_model(
        BuildRequest(
            spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work", options=ServingOptions()
        ),
        built,
    )
    http_port, grpc_port, admin_port = endpoints.free_ports(3)
    settings = ClusterSettings(
        root / "repo",
        replicas=2,
        http_port=http_port,
        grpc_port=grpc_port,
        admin_port=admin_port,
        state_dir=root / "state",
        balancing=Balancing(),
    )
    start_cluster(settings)
    yield settings
    pids = _our_pids(settings)
    stop_stack(settings.state_dir)
    _await(lambda: not [p for p in pids if _alive(p)], 30)


def _our_pids(settings) -> list[int]:
    """Every process of the cluster: Envoy's keeper and Envoy, each supervisor, server and stub."""
    from tpserve.server.triton.processes import stubs

    state, pids = read_stack(settings.state_dir), []
    pids.append(state.envoy_pid)
    for replica in state.replicas:
        folder = settings.state_dir / replica.name
        server = endpoints.read_state(folder).pid
        pids += [server, *(pid for _, _, pid in stubs(server))]
        pids.append(int(json.loads((folder / "supervisor.json").read_text())["pid"]))
    return pids


def _alive(pid: int) -> bool:
    try:
        return bool(open(f"/proc/{pid}/cmdline", "rb").read())
    except OSError:
        return False


def _await(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def _front(settings, protocol):
    return endpoint_of(endpoints.read_state(settings.state_dir), settings.repo, protocol)


def _inferences(settings, replica: str) -> int:
    state = endpoints.read_state(settings.state_dir / replica)
    ep = endpoint_of(state, settings.repo, "http")
    with ep.client() as client:
        stats = client.get_inference_statistics("digits_cnn", headers=ep.admin_headers)
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])


def _pending(settings, replica: str) -> float:
    """Requests of digits_cnn waiting in the replica's queue (Triton's own gauge), inf where it did not answer."""
    state = endpoints.read_state(settings.state_dir / replica)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{state.metrics_port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return float("inf")
    found = [line for line in text.splitlines() if line.startswith("nv_inference_pending_request_count{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in found if 'model="digits_cnn"' in line)


def _load(settings) -> ClosedLoop:
    """One closed-loop client per protocol through Envoy."""
    return ClosedLoop([_front(settings, p) for p in ("http", "grpc")], "digits_cnn", {"input": X}, settle=1.0)


def test_requests_through_envoy_reach_every_replica_on_both_protocols(cluster):
    before = {r: _inferences(cluster, r) for r in ("replica-0", "replica-1")}
    for protocol in ("http", "grpc"):
        ep = _front(cluster, protocol)
        with ep.client() as client:
            for _ in range(20):
                assert infer(ep, "digits_cnn", {"input": X}, client=client).outputs["logits"].shape == (1, 10)
    served = lambda: {r: _inferences(cluster, r) - before[r] for r in before}  # noqa: E731
    _await(lambda: sum(served().values()) >= 40, 5)  # tritonserver counts a request after its answer has left
    counts = served()
    assert sum(counts.values()) == 40 and min(counts.values()) > 0, counts


def test_admin_apis_stay_locked_through_envoy(cluster):
    url = f"http://127.0.0.1:{cluster.http_port}/v2/repository/index"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5)
    assert refused.value.code == 403
    key = launcher.admin_key(cluster.state_dir).read_text().strip()
    for _ in range(4):  # whichever replica answers, the cluster's key opens it
        request = urllib.request.Request(url, method="POST", headers={"admin-key": key})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200


def test_cancelled_grpc_calls_through_envoy_crash_no_replica(cluster):
    """Envoy passes each cancellation on as a stream reset; the guard keeps tritonserver from seeing one."""
    servers = {r: endpoints.read_state(cluster.state_dir / r).pid for r in ("replica-0", "replica-1")}
    made = cancel_storm(endpoints.read_state(cluster.state_dir).grpc_url, "digits_cnn", {"input": X}, seconds=15)
    print(f"cancelled gRPC calls through the cluster's Envoy: {made}")
    assert made > 1000
    assert {r: endpoints.read_state(cluster.state_dir / r).pid for r in servers} == servers, "a replica restarted"
    started = time.monotonic()  # the cancelled calls are bounded by the model's queue: it drains
    _await(lambda: all(_pending(cluster, r) == 0 for r in servers), 60)
    print(f"the replicas' queues drained {time.monotonic() - started:.2f} s after the storm")
    time.sleep(1.2)  # the notice counts the last second's cancelled calls too (cancel_notice.c: WINDOW): it passes
    for protocol in ("http", "grpc"):
        assert infer(_front(cluster, protocol), "digits_cnn", {"input": X}).outputs["logits"].shape == (1, 10)


def test_make_soak_samples_every_replica_and_envoy(cluster):
    from tpserve.loadtest.benches.soak import served_processes

    found = served_processes(cluster.state_dir)
    for replica in ("replica-0", "replica-1"):
        assert found[f"{replica} tritonserver"] == endpoints.read_state(cluster.state_dir / replica).pid
        assert f"{replica} digits_cnn #0" in found and f"{replica} supervisor" in found
    assert found["envoy keeper"] == read_stack(cluster.state_dir).envoy_pid and "envoy" in found


def test_a_replica_killed_under_load_costs_at_most_the_requests_in_flight(cluster):
    victim = endpoints.read_state(cluster.state_dir / "replica-0").pid
    with _load(cluster) as load:
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        _await(lambda: not _all_healthy(cluster), 10)  # Envoy saw it go
        down_seen = time.monotonic()

        _await(lambda: replica_restarted(cluster.state_dir, "replica-0", victim) and _all_healthy(cluster), 60)
        back = time.monotonic()
    failures = load.failures()
    print(
        f"kill: {len(load.log)} requests, {len(failures)} failed; marked down after {down_seen - killed:.2f} s, "
        f"back in Envoy after {back - killed:.1f} s"
    )
    assert len(load.log) > 50
    assert len(failures) <= 2, failures  # one request in flight per client at most
    assert all(start <= killed + 0.05 for _, start, _, _ in failures), (failures, killed, down_seen)


def _all_healthy(cluster) -> bool:
    return set(_flags(cluster)) == {"healthy"}


def _flags(cluster) -> list[str]:
    """Envoy's health flags of every replica in both upstream clusters ('healthy' or why not)."""
    return [flags for hosts in host_health(admin_socket(cluster.state_dir)).values() for flags in hosts.values()]


def test_a_rolling_restart_under_load_fails_no_request(cluster):
    with _load(cluster) as load:
        done = restart_replicas(cluster.state_dir)
    print(f"rolling restart: {done}; {len(load.log)} requests, {len(load.failures())} failed")
    assert [d["replica"] for d in done] == ["replica-0", "replica-1"]
    assert len(load.log) > 50
    assert not load.failures(), load.failures()[:3]
