"""How many requests the edge lets wait for each replica: past it, a request is refused at once (HTTP 503,
gRPC UNAVAILABLE, with a retry hint) instead of joining a queue that would answer it only after many seconds.

A model keeps its instances busy with QUEUED_BATCHES full batches waiting per instance; more waiting adds latency,
never throughput. The bound is what the repository's largest model needs that way, per replica, within [FLOOR,
CEILING]: a flood of one model (the usual overload) then waits seconds, not minutes, at the cost of fuller
batches where several models are flooded at once (raise it with `--max-waiting`). Envoy enforces it as the circuit
breaker of each upstream cluster (HTTP and gRPC); its stats count the refusals
(cluster.replicas_<protocol>.upstream_rq_pending_overflow) and a refused request's answer says "overflow".
"""

from __future__ import annotations

from pathlib import Path

QUEUED_BATCHES = 2
FLOOR, CEILING = 64, 4096


def instances(config) -> int:
    """Instances of a model: its groups' counts (1 without a group), a group on listed GPUs once per GPU."""
    if not config.instance_group:
        return 1
    return sum(max(1, g.count) * max(1, len(g.gpus)) for g in config.instance_group)


def waiting_bound(repo: Path) -> int:
    """Requests that may wait on one replica serving repo (FLOOR where nothing can be read)."""
    from tpserve.builders.repository.model_config import repository_configs

    try:
        configs = list(repository_configs(repo))
    except OSError:  # a repository we cannot read is the server's to judge: keep Envoy's bound modest
        return FLOOR
    wanted = max((QUEUED_BATCHES * max(1, int(c.max_batch_size)) * instances(c) for _, c in configs), default=0)
    return max(FLOOR, min(CEILING, wanted))
