"""One supervised tritonserver behind the edge (a replica): where it listens, what it shares with the front, its start.

A replica keeps its own folder, `<state folder>/replica-<i>/` (its supervisor, server, log), holds the front's
admin key (admin calls through Envoy reach any replica), and reads the front's tables: the cancelled calls, its
slot of the backlog, and the admission table where the front admits by queue time (server/edge/front.py).
"""

from __future__ import annotations

import shutil
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from tpserve.common.cli import step
from tpserve.server.edge.envoy_config import Replica
from tpserve.server.edge.front import admission_of, cancelled_calls
from tpserve.server.supervision.supervisor import HEALTH_SOCKET
from tpserve.server.supervision.supervisor_process import start_supervised
from tpserve.server.triton import launcher


@dataclass(frozen=True)
class ReplicaSettings:
    """How one replica runs: its ports (http and grpc behind Envoy, metrics, readiness) and its server's knobs."""

    repo: Path
    _: KW_ONLY
    index: int
    http_port: int
    grpc_port: int
    metrics_port: int
    health_port: int
    stack_dir: Path  # the front's state folder: its key and tables; this replica's own folder is inside it
    host: str = "127.0.0.1"
    startup_timeout: float = 180.0
    internal: tuple[str, ...] = ("http", "grpc")  # its ports that only the edge (and this user's tools) reach
    tuning: launcher.TritonTuning = launcher.TritonTuning()
    ragged_stats: Path | None = None
    queue_slo: str = ""
    env: dict[str, str] = field(default_factory=dict)  # added to its environment: CUDA_VISIBLE_DEVICES
    drain: float = 0.0  # seconds a stopping replica keeps answering while Envoy notices (Balancing.drain_seconds)

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    @property
    def folder(self) -> Path:
        return self.stack_dir / self.name

    def server_settings(self) -> launcher.ServerSettings:
        """Its tritonserver's settings, with the front's tables."""
        return launcher.ServerSettings(
            self.repo,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            host=self.host,
            state_dir=self.folder,
            startup_timeout=self.startup_timeout,
            internal=self.internal,
            tuning=self.tuning,
            cancelled_calls=cancelled_calls(self.stack_dir),
            backlog_slot=self.index,
            ragged_stats=self.ragged_stats,
            admission_table=admission_of(self.stack_dir),
            queue_budgets=self.queue_slo,
        )


def start_replica(settings: ReplicaSettings) -> Replica:
    """Start the replica's supervisor and return once its server is ready; its address as Envoy routes to it."""
    settings.folder.mkdir(parents=True, exist_ok=True)
    key = launcher.admin_key(settings.stack_dir)
    if not (settings.folder / key.name).exists():  # one key for the stack: admin calls reach any replica
        shutil.copy2(key, settings.folder / key.name)
    where = f", GPU {settings.env['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in settings.env else ""
    step(
        f"{settings.name}: starting on http {settings.http_port}, grpc {settings.grpc_port}, "
        f"metrics {settings.metrics_port}, readiness {settings.health_port}{where}"
    )
    start_supervised(settings.server_settings(), settings.health_port, drain=settings.drain, env=settings.env)
    return Replica(
        settings.name,
        settings.http_port,
        settings.grpc_port,
        settings.health_port,
        settings.host,
        str(settings.folder.absolute() / HEALTH_SOCKET),
    )
