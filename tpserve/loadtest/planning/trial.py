"""One trial of the plan: a deployment started on free ports, the recording (or its first seconds) replayed open
loop at a speed against it, what came back judged against the SLO, where the time went from the server's own
statistics; the deployment stopped."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpserve.common.cli import step
from tpserve.loadtest.planning.deployment import Deployment, repository_for

MEETS, MISSES, CLEAR_MISS = "meets", "misses", "clear miss"
CONNECTIONS = 256  # HTTP connections a fast replay process may open: an overloaded deployment queues, not the client
BEHIND_MS = 100.0  # a replay further behind its schedule measured the load generator, not the deployment


@dataclass(frozen=True, kw_only=True)
class Trial:
    """What one replay against one deployment showed."""

    deployment: Deployment
    speed: float  # the recording's rate times this
    probe: bool  # only the recording's first seconds
    offered_per_s: float
    sent: int
    failed: int
    p99_ms: float
    answered_per_s: float  # answers over the time from the first send to the last answer
    over_slo: int  # answers slower than the SLO
    behind_ms: float  # how far the load generator fell behind its schedule at worst
    client_busy: float = 0.0  # the busiest load-generating process's CPU over the replay, in cores (fast generator)
    phases_us: dict = field(default_factory=dict)  # per request, from the server: queue, compute
    failures: dict = field(default_factory=dict)  # what the failed requests got (the commonest, with counts)
    refused: int = 0  # of them, the edge's refusals past the requests that may wait on a replica (all counted)
    verdict: str = MISSES
    why: str = ""

    def to_dict(self) -> dict:
        data = asdict(self)
        data["deployment"] = {**asdict(self.deployment), "label": self.deployment.label()}
        return data


REFUSED = ("http 503", "grpc UNAVAILABLE")  # how the edge refuses past the requests that may wait on a replica


def refused(trial: Trial) -> int:
    """The trial's requests the edge refused past the requests that may wait on a replica (a trial written before
    they were counted apart: those among its commonest failures)."""
    return trial.refused or sum(count for what, count in trial.failures.items() if what in REFUSED)


def judge(trial: Trial, slo_ms: float, full_count: int) -> Trial:
    """The verdict: meets (no failure, p99 within the SLO), misses, or a clear miss (a probe whose slow or failed
    answers alone exceed 1% of the whole replay's requests: the whole replay's p99 cannot meet the SLO)."""
    from dataclasses import replace

    worst_allowed = math.floor(0.01 * full_count)
    if trial.probe and trial.failed + trial.over_slo > worst_allowed:
        why = f"{trial.failed} failed and {trial.over_slo} over {slo_ms:g} ms in the first seconds alone"
        return replace(trial, verdict=CLEAR_MISS, why=why)
    if trial.failed:
        return replace(trial, verdict=MISSES, why=f"{trial.failed} of {trial.sent} requests failed")
    if not trial.p99_ms <= slo_ms:
        return replace(trial, verdict=MISSES, why=f"p99 {trial.p99_ms:.1f} ms > {slo_ms:g} ms")
    return replace(trial, verdict=MEETS, why=f"p99 {trial.p99_ms:.1f} ms ≤ {slo_ms:g} ms, none failed")


def figures(sent: list[dict], items: list, slo_ms: float) -> dict:
    """A replay's answers (run_replay's 'sent') as the trial's figures."""
    from tpserve.loadtest.reporting.replay_report import percentile

    ok = [s for s in sent if s["status"] in ("ok", 200, 0)]
    latencies = [s["ms"] for s in ok]
    span = max(items[-1].offset_s, 1e-3) if items else 1.0
    last_answer = max((s["sent_s"] + s["ms"] / 1000 for s in ok), default=0.0)
    return {
        "offered_per_s": len(items) / span,
        "sent": len(sent),
        "failed": len(sent) - len(ok) + max(0, len(items) - len(sent)),
        "p99_ms": percentile(latencies, 99) if latencies else float("inf"),
        "answered_per_s": len(ok) / max(last_answer, 1e-3),
        "over_slo": sum(1 for ms in latencies if ms > slo_ms),
        **_failures(sent),
    }


def _failures(sent: list[dict]) -> dict:
    """What the failed requests got: the four commonest answers, and the edge's refusals counted before that cut."""
    from collections import Counter

    from tpserve.loadtest.reporting.replay_report import outcome

    said = Counter(outcome(s.get("protocol", ""), s["status"]) for s in sent)
    said.pop("ok", None)
    return {"failures": dict(said.most_common(4)), "refused": sum(said[what] for what in REFUSED)}


@dataclass(frozen=True, kw_only=True)
class TrialRun:
    """How to run trials: the user's repository, the recording to replay (answered requests only), where."""

    repo: Path
    recording: Path
    models: tuple[str, ...]
    out: Path
    startup_timeout: float = 300.0
    warmup_s: float = 2.0  # replay seconds sent to a fresh deployment first, not measured: its cold start is not
    # its capacity
    generator: str = "fast"
    processes: int = 0


def run_trial(run: TrialRun, deployment: Deployment, speed: float, seconds: float, slo_ms: float, name: str) -> dict:
    """Start the deployment, warm it (the first warmup_s seconds replayed, not counted), replay (seconds > 0: only
    the first seconds), stop it; the trial's figures."""
    from dataclasses import replace

    from tpserve.loadtest.locust_suite.replay import Replay, run_replay

    folder = run.out / "trials" / name
    repository = repository_for(run.repo, deployment, run.out / "deployments" / deployment.slug())
    step(f"plan: {name}: {deployment.label()}, replay x{speed:g}{f' (first {seconds:g} s)' if seconds else ''}")
    with _deployed(repository, deployment, folder / "state", run.startup_timeout) as state:
        replay = Replay(
            recording=run.recording,
            speed=speed,
            models=run.models,
            max_seconds=seconds,
            generator=run.generator,
            processes=run.processes,
            connections=CONNECTIONS if run.generator == "fast" else Replay.connections,  # Locust's: the replay's own
        )
        if run.warmup_s > 0:
            warm = replace(replay, max_seconds=run.warmup_s)
            run_replay(warm, state.http_url, state.grpc_url, repository, folder / "warmup")
        result = run_replay(replay, state.http_url, state.grpc_url, repository, folder / "replay")
        phases = _phases(folder / "state", repository, run.models, deployment.replicas)
    found = figures(result["results"]["sent"], result["items"], slo_ms)
    client_busy = result["results"].get("client_busy", 0.0)
    return {**found, "behind_ms": result["results"]["behind_s"] * 1000, "client_busy": client_busy, "phases_us": phases}


@contextmanager
def _deployed(repository: Path, deployment: Deployment, state_dir: Path, timeout: float):
    """One replica: as `serve` starts it (its default front, the checks in the server); more: as `cluster` does
    (Envoy in front); free ports; the requests that may wait as MAX_WAITING= sets them (per replica). Yields the
    state clients use; always stopped."""
    from tpserve.common import endpoints
    from tpserve.server.cluster import start_cluster
    from tpserve.server.fronts import served_as_started
    from tpserve.server.stack import stop_stack

    if deployment.replicas == 1:
        with served_as_started(
            repository, state_dir, direct=False, startup_timeout=timeout, max_waiting=deployment.max_waiting
        ) as (state, _):
            yield state
        return
    start_cluster(_cluster(repository, deployment, state_dir, timeout))
    try:
        yield endpoints.read_state(state_dir)
    finally:
        stop_stack(state_dir)


def _cluster(repository: Path, deployment: Deployment, state_dir: Path, timeout: float):
    from tpserve.common import endpoints
    from tpserve.server.cluster import ClusterSettings
    from tpserve.server.edge.envoy_config import Balancing

    balancing = Balancing(max_requests=deployment.max_waiting * deployment.replicas)
    http_port, grpc_port, admin_port = endpoints.free_ports(3)
    return ClusterSettings(
        repository,
        replicas=deployment.replicas,
        http_port=http_port,
        grpc_port=grpc_port,
        admin_port=admin_port,
        state_dir=state_dir,
        startup_timeout=timeout,
        gpu_per_replica=deployment.gpu_per_replica,
        balancing=balancing,
    )


def _phases(state_dir: Path, repository: Path, models: tuple[str, ...], replicas: int) -> dict:
    """Average µs per request in the queue and in compute (input + infer + output), over every replica and the
    replayed models (their ensembles' steps counted once, as themselves), from Triton's statistics."""
    from tpserve.clients.breakdown import breakdown
    from tpserve.common import endpoints

    totals = {"requests": 0, "queue_us": 0.0, "compute_us": 0.0}
    folders = [state_dir / f"replica-{index}" for index in range(replicas)] if replicas > 1 else [state_dir]
    for folder in folders:
        ep = endpoints.read_state(folder).endpoint("grpc", repository)
        for model in models:
            whole = breakdown(ep, model)[-1]
            count = whole["requests"]
            totals["requests"] += count
            totals["queue_us"] += whole["queue_us"] * count
            compute = whole["compute_input_us"] + whole["compute_infer_us"] + whole["compute_output_us"]
            totals["compute_us"] += compute * count
    count = totals["requests"] or 1
    return {
        "requests": totals["requests"],
        "queue_us": totals["queue_us"] / count,
        "compute_us": totals["compute_us"] / count,
    }
