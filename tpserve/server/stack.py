"""What runs behind one Envoy front (a stack): how it is asked for, its record, its start and stop, a rolling restart.

A stack is an edge front (server/edge/front.py) before N replicas (server/replica.py). Two kinds compose it:
one server behind the edge (server/single.py: `server start --front envoy`) and a cluster of replicas
(server/cluster.py: `make cluster`). Each says its front and its replicas; this module starts them in order
(replicas, then Envoy), keeps the record, and stops what it started.

Layout of the state folder: the front's files (envoy.json, envoy.log, envoy-admin.sock, its tables), one
`replica-<i>/` per replica, `cluster.json` (this record: what to stop) and `server.json` pointing at Envoy's
listeners, so that the clients, perf and Locust commands of STATE_DIR go through the front. Nothing started here
holds the caller's stdout or stderr.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import KW_ONLY, asdict, dataclass, field, fields
from pathlib import Path

from tpserve.common import endpoints
from tpserve.common.cli import step
from tpserve.common.errors import ServerError
from tpserve.server.edge.envoy_config import Balancing, Replica
from tpserve.server.edge.front import (
    EdgeFront,
    admin_socket,
    await_routable,
    envoy_binary,
    prepare_tables,
    start_envoy,
)
from tpserve.server.edge.recording import RecordSettings
from tpserve.server.edge.request_checks import EdgeLimits
from tpserve.server.replica import ReplicaSettings, start_replica
from tpserve.server.supervision.supervisor_process import await_supervisor, signal_supervisor, stop_supervisor
from tpserve.server.triton import launcher
from tpserve.server.triton.processes import terminate_group

RECORD = "cluster.json"  # named when only clusters had one: a stack started before still stops


@dataclass(frozen=True)
class StackSettings:
    """What a stack's kinds share: the repository every replica serves, the front's listeners and checks, and the
    replicas' server knobs. A kind says the rest: its front's stats port and each replica's ports."""

    repo: Path
    _: KW_ONLY
    http_port: int = endpoints.HTTP_PORT
    grpc_port: int = endpoints.GRPC_PORT
    host: str = "127.0.0.1"
    state_dir: Path = endpoints.STATE_DIR
    startup_timeout: float = 180.0
    balancing: Balancing = Balancing()
    edge: EdgeLimits | None = EdgeLimits()  # Envoy checks HTTP requests before a replica sees them (None: off)
    tls: tuple[str, str] | None = None  # (certificate chain, private key): Envoy's listeners speak TLS
    record: RecordSettings | None = None  # record the traffic at the edge (HTTP and gRPC both go through Envoy)
    tuning: launcher.TritonTuning = launcher.TritonTuning()  # every replica's tritonserver knobs
    ragged_stats: Path | None = None  # where ragged models write their per-batch statistics (text-bench reads them)
    queue_slo: str = ""  # admission by queue time: "20" or "model=20 *=50" (ms; supervision/admission_control.py)
    grpc_streaming: bool = False  # ModelStreamInfer reaches the replicas (off: Envoy refuses it; edge/envoy_config.py)

    single = False  # one server behind the edge (its metrics and readiness are its own ports)
    replicas = 1

    def __post_init__(self):
        self.front()  # what the front refuses, refused before anything starts

    @property
    def metrics_port(self) -> int:
        """The metrics port clients are told of (server.json)."""
        raise NotImplementedError

    @property
    def internal(self) -> tuple[str, ...]:
        """The replicas' ports that only the edge (and our own user's tools) reach."""
        raise NotImplementedError

    def stats_port(self) -> int:
        """Envoy's stats listener (0: none)."""
        raise NotImplementedError

    def replica_ports(self, index: int) -> list[int]:
        """http, grpc, metrics and readiness ports of replica index."""
        raise NotImplementedError

    def replica_env(self, index: int) -> dict[str, str]:
        """What replica index adds to its environment."""
        return {}

    def front(self) -> EdgeFront:
        return EdgeFront(
            self.repo,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            stats_port=self.stats_port(),
            host=self.host,
            state_dir=self.state_dir,
            balancing=self.balancing,
            edge=self.edge,
            tls=self.tls,
            record=self.record,
            queue_slo=self.queue_slo,
            grpc_streaming=self.grpc_streaming,
        )

    def replica(self, index: int) -> ReplicaSettings:
        """Replica index, its ports taken now (free ones are free at its start)."""
        http, grpc, metrics, health = self.replica_ports(index)
        return ReplicaSettings(
            self.repo,
            index=index,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            health_port=health,
            stack_dir=self.state_dir,
            host=self.host,
            startup_timeout=self.startup_timeout,
            internal=self.internal,
            tuning=self.tuning,
            ragged_stats=self.ragged_stats,
            queue_slo=self.queue_slo,
            env=self.replica_env(index),
            drain=self.balancing.drain_seconds,
        )


@dataclass(kw_only=True)
class StackState:
    """cluster.json: what a stack's start started, for stop, restart, status and the monitoring. Written after each
    replica, so a start cut short can still be stopped."""

    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    admin_port: int = 0  # the metrics clients read: Envoy's GET /stats/prometheus, or a single server's own
    stats_port: int = 0  # 0: no Envoy stats listener (a single server behind the edge)
    repo: str = ""
    single: bool = False  # one server behind the edge
    recording: str = ""  # the traffic recording's folder ("": not recording)
    replicas: list[Replica] = field(default_factory=list)
    envoy_pid: int | None = None  # Envoy's keeper (python -m tpserve.server envoy-run)
    env: dict[str, dict] = field(default_factory=dict)  # per replica: its environment (CUDA_VISIBLE_DEVICES)
    internal: list[str] = field(default_factory=list)  # the replicas' ports only the edge reaches (the guard's)
    tuning: dict = field(default_factory=dict)  # the replicas' TritonTuning, as started (a restart keeps it)
    queue_slo: str = ""  # the queue-time budgets the edge admits by (a restart keeps them)
    format_version: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StackState:
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        if "stats_port" not in data:  # written before it was recorded: Envoy served stats on admin_port
            known["stats_port"] = 0 if data.get("single") else data.get("admin_port", 0)
        return cls(**{**known, "replicas": [Replica(**r) for r in data.get("replicas", [])]})

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)


def start_stack(settings: StackSettings) -> StackState:
    """Start the replicas one by one, then Envoy; return once Envoy routes to every replica.

    Raises:
        ServerError: a port is taken, a replica or Envoy did not come up (everything started is stopped).
    """
    front = settings.front()
    launcher.refuse_running(front.state_dir)  # before anything: a second stack would overwrite its records
    for label, port in front.ports:
        launcher.check_port_free(front.host, label, port)
    envoy_binary()  # installed, or say how before starting anything
    launcher.private_state(front.state_dir)
    state = _new_state(settings)
    prepare_tables(front)
    try:
        for index in range(settings.replicas):
            replica = settings.replica(index)
            state.replicas.append(start_replica(replica))
            state.env[replica.name] = replica.env
            _write(front.state_dir, state)
        state.envoy_pid = start_envoy(front, tuple(state.replicas))
        _write(front.state_dir, state)
        await_routable(admin_socket(front.state_dir), settings.replicas, settings.startup_timeout)
    except BaseException:
        stop_stack(front.state_dir)
        raise
    _write_front(settings, state)
    return state


def _new_state(settings: StackSettings) -> StackState:
    """cluster.json's record of what settings start, before anything has started."""
    return StackState(
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        admin_port=settings.metrics_port,
        stats_port=settings.stats_port(),
        repo=str(settings.repo.resolve()),
        single=settings.single,
        recording=str(settings.record.folder) if settings.record else "",
        internal=list(settings.internal),
        tuning=asdict(settings.tuning),
        queue_slo=settings.queue_slo,
    )


def _write(state_dir: Path, state: StackState) -> None:
    path = state_dir / RECORD
    partial = path.with_name(f".{RECORD}.partial")
    partial.write_text(json.dumps(state.to_dict(), indent=2))
    os.replace(partial, path)


def _write_front(settings: StackSettings, state: StackState) -> None:
    """server.json of the state folder, pointing at Envoy, for the clients and measurement commands."""
    assert state.envoy_pid is not None, "written once Envoy runs"
    front = endpoints.ServerState(
        pid=state.envoy_pid,
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        metrics_port=settings.metrics_port,
        repo=str(settings.repo.resolve()),
        log=str((settings.state_dir / "envoy.log").resolve()),
        admin_key_file=str(launcher.admin_key(settings.state_dir).resolve()),
    )
    endpoints.write_state(settings.state_dir, front)


def read_stack(state_dir: Path) -> StackState:
    """The stack started from state_dir.

    Raises:
        ServerError: none was.
    """
    path = state_dir / RECORD
    if not path.exists():
        raise ServerError(f"no cluster in {state_dir}: start one with `make cluster`")
    return StackState.from_dict(json.loads(path.read_text()))


def is_stack(state_dir: Path) -> bool:
    """Whether state_dir holds a stack's record (Envoy in front), not a lone server's."""
    return (Path(state_dir) / RECORD).exists()


def replica_ready(state_dir: Path, name: str, model: str | None = None) -> bool:
    """Whether a replica's supervisor says it is ready (its server up and answering), or, given a model, that
    the model is ready there (loaded, not being healed)."""
    replica = read_stack(state_dir).replica(name)
    path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
    try:
        url = f"http://{replica.host}:{replica.health_port}{path}"
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def replica_restarted(state_dir: Path, name: str, old_pid: int) -> bool:
    """Whether a replica runs a server other than old_pid and is ready. No record reads as not yet: a restart
    that failed (a port the dying server still held) removes it before it tries again."""
    try:
        return endpoints.read_state(state_dir / name).pid != old_pid and replica_ready(state_dir, name)
    except ServerError:
        return False


def _tuning_of(state: StackState) -> launcher.TritonTuning:
    """The replicas' tuning as cluster.json keeps it (none kept: the defaults)."""
    kept = state.tuning
    return launcher.TritonTuning(
        args=tuple(kept.get("args", ())),
        latency_summaries=bool(kept.get("latency_summaries", True)),
        latency_quantiles=str(kept.get("latency_quantiles", launcher.DEFAULT_QUANTILES)),
    )


def restart_replicas(state_dir: Path, timeout: float = 180.0) -> list[dict]:
    """Rolling restart: each replica in turn is stopped (gracefully) and started on the same ports, and
    the next one waits until Envoy routes to it again. Returns (replica, seconds) per replica."""
    state, done = read_stack(state_dir), []
    for index, replica in enumerate(state.replicas):
        started = time.monotonic()
        folder = state_dir / replica.name
        server = endpoints.read_state(folder)
        step(f"{replica.name}: restarting")
        stop_supervisor(folder)
        launcher.stop(folder)
        again = ReplicaSettings(
            Path(state.repo),
            index=index,
            http_port=replica.http_port,
            grpc_port=replica.grpc_port,
            metrics_port=server.metrics_port,
            health_port=replica.health_port,
            stack_dir=state_dir,
            host=replica.host,
            startup_timeout=timeout,
            internal=tuple(state.internal),
            tuning=_tuning_of(state),
            queue_slo=state.queue_slo,
            env=state.env.get(replica.name, {}),
            drain=Balancing().drain_seconds,
        )
        start_replica(again)
        await_routable(admin_socket(state_dir), len(state.replicas), timeout)
        done.append({"replica": replica.name, "seconds": round(time.monotonic() - started, 1)})
    return done


def stop_stack(state_dir: Path) -> bool:
    """Stop Envoy, then every replica (supervisor, server, stubs); return whether a stack ran."""
    path = state_dir / RECORD
    if not path.exists():
        return False
    state = StackState.from_dict(json.loads(path.read_text() or "{}"))
    if state.envoy_pid:  # its keeper alone: it gives Envoy one SIGTERM (server/edge/envoy_process.py says why)
        terminate_group(state.envoy_pid, leader_only=True)
    # with Envoy gone nothing routes to a replica: each stops at once (no drain), all of them together
    folders = [state_dir / replica.name for replica in state.replicas]
    signalled = [(folder, signal_supervisor(folder, drain=False)) for folder in folders]
    for folder, pid in signalled:
        if pid is not None:
            await_supervisor(folder, pid)
        launcher.stop(folder)
    path.unlink(missing_ok=True)
    (state_dir / endpoints.STATE).unlink(missing_ok=True)
    return True
