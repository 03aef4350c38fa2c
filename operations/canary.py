"""Canary by traffic share (`make rollout ... CANARY="1 10 50 100"`).

The new build serves beside the old one as <model>__candidate. The edge sends it a share of the model's HTTP
inference requests (server/envoy_config.py: a route per model that rewrites the name for the percent held in
Envoy's runtime key canary.<model>, set here through the admin socket). Each step is held for hold_s and gated,
every poll_s, on the candidate's own figures against the old version's over the same window, from each
replica's Triton metrics:
- errors: the candidate's failed share may exceed the old version's by at most max_error_delta;
- latency: the candidate's mean latency over the window may be at most latency_ratio times the old version's plus
  latency_slack_ms. Triton 2.51 keeps no per-model histogram, and its latency summary's p99 slides over older
  requests (the canary's own accuracy pass among them), so the p99 is reported beside, not gated on;
- evidence: a step passes once the candidate answered min_requests in it; without them by three times the hold
  it fails (no traffic is no proof).
A breach sets the share to 0 at once (the next request goes to the old version) and raises CanaryBreach.
gRPC requests carry the model's name in their body: they stay on the old version until the build is promoted.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from common.cli import step
from common.errors import ServerError


@dataclass(frozen=True)
class CanaryPlan:
    """The steps (percent of the model's HTTP traffic), how long each is held, and the gate."""

    steps: tuple[int, ...] = (1, 10, 50, 100)
    hold_s: float = 30.0
    poll_s: float = 1.0
    max_error_delta: float = 0.01  # the candidate's error share may exceed the old version's by this
    latency_ratio: float = 1.5
    latency_slack_ms: float = 5.0
    min_requests: int = 10  # a step passes with at least this many candidate requests (waits up to 3x its hold)

    def __post_init__(self):
        if not self.steps or any(not 0 < s <= 100 for s in self.steps) or list(self.steps) != sorted(self.steps):
            raise ServerError(f"CANARY={' '.join(map(str, self.steps))}: rising percents in 1..100, e.g. '1 10 50 100'")
        if self.hold_s <= 0 or self.poll_s <= 0:
            raise ServerError("a canary step's hold and poll are positive seconds")


class CanaryBreach(ServerError):
    """A step's gate failed; the share is back at 0."""

    def __init__(self, message: str, steps: list[dict]):
        super().__init__(message)
        self.steps = steps


@dataclass
class Counts:
    """One model's cumulative counters summed over the replicas (a snapshot)."""

    success: float = 0.0
    failure: float = 0.0
    duration_us: float = 0.0
    p99_us: list = field(default_factory=list)  # each replica's summary p99 (empty: summaries off)


def read_counts(metrics_urls: list[str], models: tuple[str, ...]) -> dict[str, Counts]:
    """Triton's counters of each model (every version), summed over each replica's /metrics, read once."""
    from prometheus_client.parser import text_string_to_metric_families

    counts = {model: Counts() for model in models}
    for url in metrics_urls:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                model = sample.labels.get("model")
                if model in counts:
                    _add(counts[model], family.name, sample)
    return counts


def _add(counts: Counts, family: str, sample) -> None:
    """One sample into the counts; counters by their family's name (the parser names their samples *_total)."""
    name, value = family if sample.name == family + "_total" else sample.name, float(sample.value)
    if name == "nv_inference_request_success":
        counts.success += value
    elif name == "nv_inference_request_failure":
        counts.failure += value
    elif name == "nv_inference_request_duration_us":
        counts.duration_us += value
    elif name == "nv_inference_request_summary_us" and sample.labels.get("quantile") == "0.99" and value == value:
        counts.p99_us.append(value)


def window(before: Counts, after: Counts) -> dict:
    """Requests, failed share and mean latency between two snapshots (exactly this window), and the p99 of
    Triton's summary (a sliding window of its own, older requests included: shown, not gated on)."""
    ok, failed = after.success - before.success, after.failure - before.failure
    requests = ok + failed
    mean_ms = (after.duration_us - before.duration_us) / ok / 1000 if ok else 0.0
    return {
        "requests": int(requests),
        "failed": int(failed),
        "error_share": round(failed / requests, 4) if requests else 0.0,
        "latency_ms": round(mean_ms, 3),
        "summary_p99_ms": round(max(after.p99_us) / 1000, 3) if after.p99_us else None,
    }


def breach(candidate: dict, old: dict, plan: CanaryPlan) -> str | None:
    """Why the candidate fails its gate in this window, or None."""
    if candidate["failed"] and candidate["error_share"] > old["error_share"] + plan.max_error_delta:
        return (
            f"errors: {candidate['failed']} of {candidate['requests']} requests ({candidate['error_share']:.1%}) "
            f"against the old version's {old['error_share']:.1%}"
        )
    limit = old["latency_ms"] * plan.latency_ratio + plan.latency_slack_ms
    if candidate["requests"] >= plan.min_requests and old["requests"] and candidate["latency_ms"] > limit:
        return (
            f"latency: mean {candidate['latency_ms']:.1f} ms in the window against the old version's "
            f"{old['latency_ms']:.1f} ms (limit {limit:.1f} ms)"
        )
    return None


def _unjudged(candidate: dict, elapsed: float, plan: CanaryPlan) -> str | None:
    """A step passes on evidence only: past three times its hold with fewer than min_requests, it fails."""
    if elapsed >= 3 * plan.hold_s and candidate["requests"] < plan.min_requests:
        return (
            f"too little traffic to judge: {candidate['requests']} requests in {elapsed:.0f} s "
            f"(a step needs {plan.min_requests}; is the model's HTTP traffic going through the edge?)"
        )
    return None


def set_share(admin_socket: Path, model: str, percent: int) -> None:
    """Send percent of the model's HTTP inference requests to its candidate (Envoy's runtime, at once).

    Raises:
        ServerError: Envoy did not take it.
    """
    from server.cluster import admin_get
    from server.envoy_config import canary_key

    status, body = admin_get(admin_socket, f"/runtime_modify?{canary_key(model)}={int(percent)}", "POST")
    if status != 200:
        raise ServerError(f"Envoy refused the canary share {percent}% for {model}: {status} {body.strip()}")


def run_steps(
    plan: CanaryPlan, model: str, candidate: str, admin_socket: Path, metrics_urls: list[str], clock=None, sleep=None
) -> list[dict]:
    """Hold each step and gate it; every step's figures. On a breach the share is 0 before this raises.

    Raises:
        CanaryBreach: a gate failed (its step and figures in .steps).
    """
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    steps, reference = [], None
    for percent in plan.steps:
        set_share(admin_socket, model, percent)
        step(f"{model}: {percent}% of its HTTP traffic to the new build, held {plan.hold_s:g} s")
        start = clock()
        base = read_counts(metrics_urls, (candidate, model))
        while True:
            sleep(plan.poll_s)
            now = read_counts(metrics_urls, (candidate, model))
            figures = {
                "percent": percent,
                "candidate": window(base[candidate], now[candidate]),
                "old": window(base[model], now[model]),
            }
            if figures["old"]["requests"] >= plan.min_requests or reference is None:
                compared = figures["old"]
            else:  # at 100% the old version's window is (nearly) empty: the last step's stands for it
                compared = reference
            why = breach(figures["candidate"], compared, plan) or _unjudged(figures["candidate"], clock() - start, plan)
            if why:
                set_share(admin_socket, model, 0)
                steps.append({**figures, "seconds": round(clock() - start, 1), "breach": why})
                raise CanaryBreach(f"step {percent}%: {why}", steps)
            if clock() - start >= plan.hold_s and figures["candidate"]["requests"] >= plan.min_requests:
                steps.append({**figures, "seconds": round(clock() - start, 1), "breach": None})
                break
        reference = compared
        step(f"{model}: {percent}% held: new {figures['candidate']}, old {figures['old']}")
    return steps
