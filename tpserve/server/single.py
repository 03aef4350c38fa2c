"""One supervised tritonserver behind the edge (`server start --front envoy`): a stack of one replica.

Envoy serves HTTP and gRPC on the ports clients are given; the server's metrics and readiness are its own ports;
its HTTP and gRPC ports are free ones behind Envoy that only this user's processes reach (the guard's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpserve.common import endpoints
from tpserve.server.stack import StackSettings, StackState, start_stack
from tpserve.server.triton import launcher


@dataclass(frozen=True, kw_only=True)
class SingleSettings(StackSettings):
    """One server behind the edge: Envoy's HTTP and gRPC ports, and the server's metrics and readiness ports."""

    metrics_port: int = endpoints.METRICS_PORT  # the server's own (clients scrape it)
    health_port: int = endpoints.HEALTH_PORT
    internal_http_port: int = 0  # tritonserver's own HTTP port behind Envoy (0: a free one)

    single = True

    @property
    def internal(self) -> tuple[str, ...]:
        return ("http", "grpc")  # its metrics are the server's own port: clients scrape it

    def stats_port(self) -> int:
        return 0

    def replica_ports(self, index: int) -> list[int]:
        promised = {self.http_port, self.grpc_port, self.metrics_port, self.health_port, self.internal_http_port}
        internal, grpc = endpoints.free_ports(2, avoid=promised)  # never a port this start has promised
        internal = self.internal_http_port or internal  # GRPC_PORT is Envoy's: 2.51's own crashed on cancels
        named = (("internal http", internal), ("grpc", grpc), ("metrics", self.metrics_port))
        for label, port in (*named, ("health", self.health_port)):
            launcher.check_port_free(self.host, label, port)
        return [internal, grpc, self.metrics_port, self.health_port]


def start_single(settings: SingleSettings) -> StackState:
    """Start the server, then Envoy in front of it; return once Envoy routes to it.

    Raises:
        ServerError: a port is taken, the server or Envoy did not come up (everything started is stopped).
    """
    return start_stack(settings)


def one_behind_edge(repo: Path, state_dir: Path, **options) -> SingleSettings:
    """One supervised server behind the edge on free 127.0.0.1 ports; options: other SingleSettings fields (edge,
    record, tuning, startup_timeout, ...)."""
    http_port, grpc_port, metrics_port, health_port = endpoints.free_ports(4)
    return SingleSettings(
        repo,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        health_port=health_port,
        state_dir=state_dir,
        **options,
    )
