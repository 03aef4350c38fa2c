"""N supervised tritonserver replicas behind Envoy (`make cluster`): a stack of N replicas.

Envoy serves HTTP, gRPC and its stats (GET /stats/prometheus) on the ports clients are given; each replica's
ports (HTTP, gRPC, metrics, readiness) are free ones, or a block from a base, that only this user's processes
reach. Inspect, restart one by one and stop it as any stack (server/stack.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpserve.common import endpoints
from tpserve.common.errors import ServerError
from tpserve.server.stack import StackSettings, StackState, start_stack
from tpserve.server.triton import launcher

MAX_REPLICAS = 100  # on one host; the edge reads "none healthy" as below 1% of them (envoy_config.PANIC_PERCENT)


@dataclass(frozen=True, kw_only=True)
class ClusterSettings(StackSettings):
    """A cluster: how many replicas, where they listen, and Envoy's stats port (admin_port)."""

    replicas: int = 2
    admin_port: int = endpoints.METRICS_PORT  # Envoy's GET /stats/prometheus
    gpu_per_replica: bool = False  # replica i sees GPU i only (CUDA_VISIBLE_DEVICES=i)
    replica_base_port: int = 0  # replica i takes the 4 ports from base + 4i (http, grpc, metrics, readiness); 0: free

    def __post_init__(self):
        super().__post_init__()
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise ServerError(
                f"REPLICAS={self.replicas}: a cluster on one host runs 1 to {MAX_REPLICAS} replicas "
                "(the edge's panic threshold, 1%, means 'none healthy' up to there)"
            )
        top = self.replica_base_port + 4 * self.replicas - 1
        if self.replica_base_port and not 1024 <= self.replica_base_port <= top <= 65535:
            raise ServerError(
                f"REPLICA_BASE_PORT={self.replica_base_port}: replicas need ports "
                f"{self.replica_base_port}..{top}, within 1024..65535"
            )

    @property
    def metrics_port(self) -> int:
        return self.admin_port  # Envoy serves the cluster's stats

    @property
    def internal(self) -> tuple[str, ...]:
        return ("http", "grpc", "metrics")  # Prometheus, started by this user, scrapes the replicas

    def stats_port(self) -> int:
        return self.admin_port

    def replica_env(self, index: int) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": str(index)} if self.gpu_per_replica else {}

    def replica_ports(self, index: int) -> list[int]:
        if not self.replica_base_port:
            return endpoints.free_ports(
                4, avoid={self.http_port, self.grpc_port, self.admin_port, endpoints.HEALTH_PORT}
            )
        base = self.replica_base_port + 4 * index
        for label, port in zip(("http", "grpc", "metrics", "health"), range(base, base + 4)):
            launcher.check_port_free(self.host, f"replica-{index} {label}", port)
        return list(range(base, base + 4))


def start_cluster(settings: ClusterSettings) -> StackState:
    """Start the replicas one by one, then Envoy; return once Envoy routes to every replica.

    Raises:
        ServerError: a port is taken, a replica or Envoy did not come up (everything started is stopped).
    """
    return start_stack(settings)
