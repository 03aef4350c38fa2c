"""`plan`: the smallest deployment of this host that serves GROWTH times a recording's traffic at a p99 SLO with
no failed request, found by replaying the recording open loop against candidates (planning/search.py), proven by
a closing replay of the whole recording against the choice, extrapolated to replicas and GPUs where this host is
too small."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.planning.deployment import Deployment, served_configs
from tpserve.loadtest.planning.search import Search, Space, per_replica_capacity, replicas_needed, search
from tpserve.loadtest.planning.trial import BEHIND_MS, MEETS, Trial, TrialRun, judge, refused, run_trial

MIN_PROBE_S = 2.0


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """One `plan`: whose traffic, how much more of it, at which p99, on which repository, where to write."""

    recording: Path
    repo: Path
    slo_p99_ms: float
    growth: float
    out: Path
    models: tuple[str, ...] = ()  # default: every recorded model the repository serves
    max_replicas: int = 0  # 0: one per GPU where there is one, else up to 4 within the CPU cores
    instances: tuple[int, ...] = (1, 2)
    delays_us: tuple[int, ...] = (0, 1000, 5000)
    probe_seconds: float = 0.0  # 0: a fifth of the replay, at least MIN_PROBE_S
    headroom: float = 1.5  # the choice is also probed at this many times GROWTH
    generator: str = "fast"  # the replay's load generator (locust_suite.GENERATORS)
    processes: int = 0  # the fast generator's (0: enough for the rate)
    max_waiting: int = 0  # requests that may wait on a replica before the edge refuses (0: as serve sets it)

    def __post_init__(self):
        if not self.slo_p99_ms > 0 or not self.growth > 0:
            raise MeasurementError(
                f"SLO_P99_MS={self.slo_p99_ms:g} and GROWTH={self.growth:g}: both are positive (GROWTH=2: twice the "
                "recorded rate)"
            )
        if any(i < 1 for i in self.instances) or any(d < 0 for d in self.delays_us) or self.max_replicas < 0:
            raise MeasurementError("instances are counts from 1, delays microseconds from 0, max replicas from 1")
        if self.max_waiting < 0:
            raise MeasurementError(f"MAX_WAITING={self.max_waiting}: requests that may wait, from 1 (0: as serve)")


@dataclass(frozen=True)
class Traffic:
    """The recording as the plan replays it: answered requests of served models only (a request that failed when
    recorded would fail again and is no deployment's failure)."""

    path: Path
    models: tuple[str, ...]
    requests: int
    seconds: float
    left_out: dict

    @property
    def rate(self) -> float:
        return self.requests / max(self.seconds, 1e-3)


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without it)."""
    if not shutil.which("nvidia-smi"):
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def space_of(request: PlanRequest) -> Space:
    """This host's sizes: one replica per GPU where there is one (each on its own GPU where there are several),
    else replicas within the CPU cores (4 at most)."""
    from tpserve.server.edge.admission import waiting_bound

    gpus = gpu_count()
    most = request.max_replicas or gpus or max(1, min(4, os.cpu_count() or 1))
    return Space(
        max_replicas=most,
        instances=request.instances,
        delays_us=request.delays_us,
        gpu_per_replica=gpus > 1,
        gpus=gpus,
        waiting=request.max_waiting,
        waiting_base=request.max_waiting or waiting_bound(request.repo),
    )


def answered_traffic(request: PlanRequest) -> Traffic:
    """The recording's answered requests of the models asked for (default: every one the repository serves),
    written to out/traffic.

    Raises:
        RecordingError: no recording, or nothing in it.
        MeasurementError: none of its models is in the repository.
    """
    from collections import Counter

    from tpserve.common.traffic import RecordingWriter, read_recording

    served = {p.parent.name for p in request.repo.glob("*/config.pbtxt")}
    asked = set(request.models) or served
    kept: list = []
    left_out: Counter = Counter()
    for r in read_recording(request.recording):
        if r.model not in asked or r.model not in served:
            left_out[f"model {r.model} not in {request.repo}" if r.model not in served else "model not asked for"] += 1
        elif not r.inputs or r.status not in (200, 0):
            left_out[f"not answered when recorded (status {r.status})"] += 1
        else:
            kept.append(r)
    if not kept:
        raise MeasurementError(
            f"{request.recording}: no answered request of a model {request.repo} serves ({dict(left_out)}); record "
            "the traffic of this repository's models (make serve RECORD=1)"
        )
    folder = request.out / "traffic"
    shutil.rmtree(folder, ignore_errors=True)
    with RecordingWriter(folder) as writer:
        for r in sorted(kept, key=lambda r: r.arrival_us):
            writer.write(r)
    seconds = (max(r.arrival_us for r in kept) - min(r.arrival_us for r in kept)) / 1e6
    models = tuple(sorted({r.model for r in kept}))
    return Traffic(folder, models, len(kept), seconds, dict(left_out))


class Evaluator:
    """Runs and judges the trials of one plan, numbered in order."""

    def __init__(self, request: PlanRequest, traffic: Traffic):
        self.request, self.traffic, self.count = request, traffic, 0
        self.seen: dict[tuple, Trial] = {}  # what deployments serving the same configs showed
        self.run = TrialRun(
            repo=request.repo,
            recording=traffic.path,
            models=traffic.models,
            out=request.out,
            generator=request.generator,
            processes=request.processes,
        )
        replay_s = traffic.seconds / request.growth
        self.probe_s = request.probe_seconds or max(MIN_PROBE_S, replay_s / 5)

    def __call__(self, deployment: Deployment, probe: bool, growth: float | None = None, fresh: bool = False) -> Trial:
        speed = growth or self.request.growth
        same = (
            deployment.replicas,
            deployment.gpu_per_replica,
            deployment.max_waiting,
            served_configs(self.request.repo, deployment),
        )
        key = (*same, probe, speed)
        if key in self.seen and not fresh:  # the search's own trials: one measurement per thing served
            earlier = self.seen[key]
            step(f"plan: {deployment.label()} serves what {earlier.deployment.label()} did: its verdict stands")
            return replace(earlier, deployment=deployment, why=f"{earlier.why} (as {earlier.deployment.label()})")
        self.count += 1
        name = f"{self.count:02d}-{'probe' if probe else 'whole'}"
        found = run_trial(self.run, deployment, speed, self.probe_s if probe else 0.0, self.request.slo_p99_ms, name)
        trial = Trial(deployment=deployment, speed=speed, probe=probe, **found)
        trial = judge(trial, self.request.slo_p99_ms, self.traffic.requests)
        if trial.behind_ms > BEHIND_MS:  # kept, and said: the figures understate the load asked for
            trial = replace(trial, why=f"{trial.why}; the load generator fell {trial.behind_ms:.0f} ms behind")
        step(f"plan: {name}: {trial.verdict} ({trial.why})")
        self.seen.setdefault(key, trial)
        return trial


@dataclass
class Plan:
    """A plan's findings, for its report."""

    request: PlanRequest
    traffic: Traffic
    space: Space
    found: Search
    closing: Trial | None
    headroom: Trial | None
    capacity_per_replica: float | None
    replicas_for_growth: int | None


CLOSING_TRIES = 3


def _closed(found: Search, space: Space, evaluate: Evaluator) -> Trial:
    """The closing replay of the choice (a fresh start, the whole recording). Where it misses, the choice was
    noise's: the same size with twice the waiting bound where the edge refused a burst, else the next larger size,
    is closed in its place (CLOSING_TRIES in all), and found.chosen follows, so that the plan never recommends
    what its own closing replay failed."""
    assert found.chosen is not None
    closing = evaluate(found.chosen.deployment, False, fresh=True)
    for _ in range(CLOSING_TRIES - 1):
        following = _next_to_close(closing.deployment, space, refused(closing) > 0)
        if closing.verdict == MEETS or following is None:
            break
        step(
            f"plan: the closing replay of {closing.deployment.label()} missed ({closing.why}): closing "
            f"{following.label()}"
        )
        found.overruled.append(closing)
        closing = evaluate(following, False, fresh=True)
        found.chosen = closing
    return closing


def _next_to_close(missed: Deployment, space: Space, burst: bool) -> Deployment | None:
    """Twice the waiting bound where the edge refused a burst (within the search's doublings), else the next
    larger size with the same bound; None where there is neither."""
    waiting = missed.max_waiting or space.waiting_base
    if burst and waiting * 2 <= space.waiting_base << space.waiting_doublings:
        return replace(missed, max_waiting=waiting * 2)
    larger = [d for d in space.sizes() if d.cost()[:2] > missed.cost()[:2]]
    return replace(larger[0], max_waiting=missed.max_waiting) if larger else None


def make_plan(request: PlanRequest) -> Plan:
    """Search, close and extrapolate (see the module's text); the report is written by planning.report."""
    request.out.mkdir(parents=True, exist_ok=True)
    traffic = answered_traffic(request)
    step(
        f"plan: {traffic.requests} requests over {traffic.seconds:.1f} s ({traffic.rate:.1f}/s) of "
        f"{', '.join(traffic.models)}; x{request.growth:g} offers {traffic.rate * request.growth:.1f}/s"
    )
    evaluate, space = Evaluator(request, traffic), space_of(request)
    found = search(space, evaluate)
    closing = headroom = None
    if found.chosen is not None:
        closing = _closed(found, space, evaluate)
        headroom = evaluate(closing.deployment, True, request.growth * request.headroom, fresh=True)
    capacity = per_replica_capacity(found.trials + [t for t in (closing, headroom) if t])
    needed = replicas_needed(traffic.rate * request.growth, capacity) if capacity else None
    return Plan(request, traffic, space, found, closing, headroom, capacity, needed)
