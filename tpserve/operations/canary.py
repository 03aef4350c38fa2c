"""Canary by traffic share (`make rollout ... CANARY="1 10 50 100"`).

The new build serves beside the old one as <model>__candidate. The edge sends it a share of the model's HTTP
inference requests (server/edge/envoy_config.py: a route per model that rewrites the name for the percent held in
Envoy's runtime key canary.<model>, set here through the admin socket; the rest of the model's unpinned HTTP
inference requests take a route of their own). Each step is held for hold_s and gated, every poll_s, on the
candidate's own figures against the old version's over the same window:
- errors, from the edge (each route's answers by status class in Envoy's stats): the candidate's share of 5xx
  answers may exceed the old version's by at most max_error_delta. The edge, not Triton, is the judge: Triton
  counts a response that a Python-backend model returns with an error as a success;
- p99, from the edge (each route's latency histogram, in fine buckets): at most latency_ratio times the old
  version's plus latency_slack_ms, judged once the candidate answered p99_requests in the window, and only while
  the old version answers in the same window (not at 100%: a p99 moves with the host's load). A p99 rests on at
  least TAIL requests: over fewer than 500 it is the 5th slowest's bucket, so a regression breaches once 5
  requests (and 1%) are past the limit, and one or two hiccups of a busy host do not;
- mean latency, from each replica's Triton metrics (exact over the window): the same limit, from min_requests;
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
from typing import Any

from tpserve.common.cli import step
from tpserve.common.errors import ServerError

TAIL = 5  # a window's p99 rests on at least this many requests (p99_ms)


@dataclass(frozen=True, kw_only=True)
class CanaryPlan:
    """The steps (percent of the model's HTTP traffic), how long each is held, and the gate."""

    steps: tuple[int, ...] = (1, 10, 50, 100)
    hold_s: float = 30.0
    poll_s: float = 1.0
    max_error_delta: float = 0.01  # the candidate's error share may exceed the old version's by this
    latency_ratio: float = 1.5
    latency_slack_ms: float = 5.0
    min_requests: int = 10  # a step passes with at least this many candidate requests (waits up to 3x its hold)
    p99_requests: int = 100  # the p99 is judged once the candidate answered this many in the window

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
    duration_us: float = 0.0


@dataclass
class Route:
    """One canary route's cumulative figures at the edge (Envoy's route stats, HTTP)."""

    completed: float = 0.0
    server_errors: float = 0.0  # 5xx answers
    client_errors: float = 0.0  # 4xx answers: the request's fault, reported, not judged
    buckets: dict = field(default_factory=dict)  # latency: upper bound (ms) -> cumulative count


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
    elif name == "nv_inference_request_duration_us":
        counts.duration_us += value


def read_edge(admin_socket: Path, model: str) -> dict[str, Route]:
    """The model's two canary routes at the edge ("new": to the candidate, "old": to itself), read once.

    Envoy merges its latency histograms when asked (stats_flush_on_admin): one query asks, the next reads.
    """
    import json
    import re
    import urllib.parse

    from tpserve.server.edge.envoy_config import canary_stat
    from tpserve.server.edge.front import admin_get

    names = "|".join(re.escape(canary_stat(model, side)) for side in ("new", "old"))
    query = "/stats?format=json&histogram_buckets=cumulative&filter=" + urllib.parse.quote(rf"\.route\.({names})\.")
    admin_get(admin_socket, query)
    time.sleep(0.05)
    status, body = admin_get(admin_socket, query)
    if status != 200:
        raise ServerError(f"Envoy's stats for the canary of {model}: {status} {body.strip()[:200]}")
    return {side: _route(json.loads(body)["stats"], canary_stat(model, side)) for side in ("new", "old")}


def _route(stats: list[dict], prefix: str) -> Route:
    """One route's figures from Envoy's JSON stats (counters by name; histograms as cumulative buckets)."""
    route, marker = Route(), f".route.{prefix}."
    for stat in stats:
        histograms = stat.get("histograms")
        for histogram in histograms if isinstance(histograms, list) else ():
            if marker in histogram["name"] and histogram["name"].endswith(".upstream_rq_time"):
                route.buckets = {float(b["upper_bound"]): float(b["cumulative"]) for b in histogram["buckets"]}
        name = stat.get("name", "")
        if marker not in name:
            continue
        leaf = name.rsplit(".", 1)[1]
        if leaf == "upstream_rq_completed":
            route.completed = float(stat["value"])
        elif leaf == "upstream_rq_5xx":
            route.server_errors = float(stat["value"])
        elif leaf == "upstream_rq_4xx":
            route.client_errors = float(stat["value"])
    return route


def p99_ms(before: dict, after: dict, tail: int = TAIL) -> float | None:
    """The bucket bound (ms) under which the window's requests were answered, all but 1% of them, or all but
    tail - 1 where 1% is fewer: a tail rests on at least `tail` requests, so one or two scheduling hiccups in a
    short window do not make its p99 (over 500 requests and more, it is the p99). The last bucket, 60 s, is past
    the edge's request timeout, so it holds them all. None without requests."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or not counts[-1]:
        return None
    allowed = max(0.01 * counts[-1], tail - 1)
    return next(b for b, c in zip(bounds, counts) if counts[-1] - c <= allowed)


def window(before: Counts, after: Counts, route_before: Route, route_after: Route) -> dict:
    """One side's figures between two snapshots: requests, 5xx and 4xx answers and the p99 at the edge (this
    route), the mean latency from Triton's counters (the model, every protocol)."""
    requests = int(route_after.completed - route_before.completed)
    failed = int(route_after.server_errors - route_before.server_errors)
    ok = after.success - before.success
    p99 = p99_ms(route_before.buckets, route_after.buckets)
    return {
        "requests": requests,
        "failed": failed,
        "client_errors": int(route_after.client_errors - route_before.client_errors),
        "error_share": round(failed / requests, 4) if requests else 0.0,
        "latency_ms": round((after.duration_us - before.duration_us) / ok / 1000, 3) if ok else 0.0,
        "p99_ms": p99,
    }


def breach(candidate: dict, old: dict, plan: CanaryPlan) -> str | None:
    """Why the candidate fails its gate in this window, or None."""
    if candidate["failed"] and candidate["error_share"] > old["error_share"] + plan.max_error_delta:
        return (
            f"errors: {candidate['failed']} of {candidate['requests']} requests answered 5xx "
            f"({candidate['error_share']:.1%}) against the old version's {old['error_share']:.1%}"
        )
    limit = old["latency_ms"] * plan.latency_ratio + plan.latency_slack_ms
    if candidate["requests"] >= plan.min_requests and old["requests"] and candidate["latency_ms"] > limit:
        return (
            f"latency: mean {candidate['latency_ms']:.1f} ms in the window against the old version's "
            f"{old['latency_ms']:.1f} ms (limit {limit:.1f} ms)"
        )
    return _p99_breach(candidate, old, plan)


def _p99_breach(candidate: dict, old: dict, plan: CanaryPlan) -> str | None:
    new_p99, old_p99 = candidate.get("p99_ms"), old.get("p99_ms")
    if candidate["requests"] < plan.p99_requests or new_p99 is None or old_p99 is None:
        return None
    limit = old_p99 * plan.latency_ratio + plan.latency_slack_ms
    if new_p99 > limit:
        return (
            f"latency: p99 {candidate['p99_ms']} ms at the edge over {candidate['requests']} requests against the "
            f"old version's {old['p99_ms']} ms (limit {limit:.1f} ms; at least {TAIL} requests and 1% past it)"
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
    from tpserve.server.edge.envoy_config import canary_key
    from tpserve.server.edge.front import admin_get

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
        base = read_counts(metrics_urls, (candidate, model)), read_edge(admin_socket, model)
        while True:
            sleep(plan.poll_s)
            now = read_counts(metrics_urls, (candidate, model)), read_edge(admin_socket, model)
            figures: dict[str, Any] = {
                "percent": percent,
                "candidate": window(base[0][candidate], now[0][candidate], base[1]["new"], now[1]["new"]),
                "old": window(base[0][model], now[0][model], base[1]["old"], now[1]["old"]),
            }
            if figures["old"]["requests"] >= plan.min_requests or reference is None:
                compared = figures["old"]
            else:  # at 100% the old version's window is (nearly) empty: the last step's stands for it, but not
                # its p99, which moves with the host's load: a p99 is judged against the same window only
                compared = {**reference, "p99_ms": None}
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
