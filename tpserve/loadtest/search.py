"""Config search: variants x instances x queue delay x preferred batch sizes, measured for real.

The tool starts its own server in explicit model-control mode and, per candidate, loads the
variant with an overriding config through the model-control API (admin key), measures it, and
unloads it. Two workloads:
- perf_analyzer at one concurrency (closed loop): the best is the most inferences/s;
- a replay of recorded traffic, or of a fitted workload (open loop, its first seconds, every request sent
  to the candidate's variant): the arrivals are fixed, so the best is the lowest p99, and a failed
  request makes a candidate infeasible. The config as built is measured first: the report gives
  the p99 before and after.
A candidate is feasible when its p99 is within the latency budget and its variant's accuracy
within the accuracy budget of the best variant (from the manifest). Quick mode hill-climbs from a
default; exhaustive mode measures every candidate. The winner's config is written back into the
repository.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError

if TYPE_CHECKING:
    from tpserve.loadtest.locust_suite.replay import Replay

DELAYS_US = (0, 100, 1000, 5000)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space."""

    variant: str
    instances: int
    delay_us: int
    preferred: tuple[int, ...]

    def label(self) -> str:
        preferred = "x".join(map(str, self.preferred)) or "-"
        return f"{self.variant} i{self.instances} d{self.delay_us} p{preferred}"


@dataclass(frozen=True)
class SearchSpace:
    """Bounded by what each variant allows (max batch size from its config)."""

    variants: tuple[str, ...]
    max_instances: int = 2
    delays_us: tuple[int, ...] = DELAYS_US
    max_batch: dict = field(default_factory=dict)
    single_instance: frozenset = frozenset()  # variants searched with 1 instance only (see one_instance_only)

    def instance_counts(self, variant: str) -> range:
        return range(1, (1 if variant in self.single_instance else self.max_instances) + 1)

    def preferred_options(self, variant: str) -> list[tuple[int, ...]]:
        top = self.max_batch[variant]
        return sorted({(), (max(1, top // 2),), (top,)})

    def candidates(self) -> list[Candidate]:
        return [
            Candidate(v, i, d, p)
            for v in self.variants
            for i in self.instance_counts(v)
            for d in self.delays_us
            for p in self.preferred_options(v)
        ]

    def neighbours(self, c: Candidate) -> list[Candidate]:
        """Candidates one step away along one dimension."""
        out = []
        axes: tuple[tuple[str, Sequence], ...] = (
            ("variant", self.variants),
            ("instances", self.instance_counts(c.variant)),
            ("delay_us", self.delays_us),
            ("preferred", self.preferred_options(c.variant)),
        )
        for axis, given in axes:
            values: list = list(given)
            if getattr(c, axis) not in values:  # a config as built, off the grid: between its grid neighbours
                values = sorted(values + [getattr(c, axis)])
            index = values.index(getattr(c, axis))
            for j in (index - 1, index + 1):
                if 0 <= j < len(values):
                    moved = {**c.__dict__, axis: values[j]}
                    if axis == "variant":
                        moved["preferred"] = self.preferred_options(values[j])[0]
                        moved["instances"] = min(c.instances, self.instance_counts(values[j])[-1])
                    out.append(Candidate(**moved))
        return out


@dataclass
class Result:
    candidate: Candidate
    throughput: float
    p99_ms: float
    feasible: bool
    reason: str = ""
    objective: str = "throughput"  # what ranks feasible candidates: throughput, or p99 (a replay's fixed arrivals)


def one_instance_only(config) -> bool:
    """A torch-runtime variant on KIND_GPU: with dynamic batching, 2 instances collapse to 0.15-0.26x of
    no batching on the H100 (CUDA MPS does not help; docs/benchmarks.md), so the search keeps it at 1."""
    from tpserve.builders.repository.model_config import on_gpu
    from tpserve.builders.repository.writer import is_torch_runtime

    return on_gpu(config) and is_torch_runtime(config)


def as_built(base, variant: str) -> Candidate:
    """The candidate that a variant's config as built is (its first instance group, its batching)."""
    instances = base.instance_group[0].count if base.instance_group else 1
    batching = base.dynamic_batching
    return Candidate(
        variant, max(1, instances), batching.max_queue_delay_microseconds, tuple(batching.preferred_batch_size)
    )


def candidate_config(base, candidate: Candidate):
    """The variant's config message with the candidate's instances and batching."""
    config = type(base)()
    config.CopyFrom(base)
    del config.instance_group[:]
    config.instance_group.add(count=candidate.instances, kind=base.instance_group[0].kind if base.instance_group else 0)
    config.dynamic_batching.max_queue_delay_microseconds = candidate.delay_us
    del config.dynamic_batching.preferred_batch_size[:]
    config.dynamic_batching.preferred_batch_size.extend(candidate.preferred)
    return config


class Searcher:
    """Measures candidates on a running server (explicit model control) with perf_analyzer."""

    def __init__(
        self, repo: Path, ep, analyzer, budgets: dict, load: dict, out: Path, urls: tuple[str, str] = ("", "")
    ):
        from tpserve.builders.repository.manifest import read_manifest
        from tpserve.builders.repository.model_config import parse_pbtxt

        self.repo, self.ep, self.analyzer, self.out, self.urls = repo, ep, analyzer, out, urls
        self.budgets, self.load = budgets, load
        self.manifest = read_manifest(repo)["models"]
        self.base: dict = {}
        self.parse = parse_pbtxt
        self.results: dict[Candidate, Result] = {}
        self.data: dict[str, Path | None] = {}

    def _input_data(self, variant: str):
        """perf_analyzer data for a variant (dynamic dims from --shape, the user's --input-data), once per variant."""
        from tpserve.builders.spec.model_spec import ModelSpec
        from tpserve.loadtest.perf.sweep import input_data_file

        if variant not in self.data:
            path = self.out / "raw" / f"{variant}_input.json"
            entry = self.manifest.get(variant, {})
            spec = ModelSpec.from_dict(entry["spec"]) if entry.get("spec") else None
            self.data[variant] = input_data_file(
                self.ep, variant, path, self.load.get("shapes"), self.load.get("input_data"), spec
            )
        return self.data[variant]

    def base_config(self, variant: str):
        if variant not in self.base:
            path = self.repo / variant / "config.pbtxt"
            if not path.exists():
                raise MeasurementError(f"variant {variant!r} is not in {self.repo}")
            self.base[variant] = self.parse(path.read_text())
        return self.base[variant]

    def measure(self, candidate: Candidate, variants: tuple[str, ...]) -> Result:
        if candidate in self.results:
            return self.results[candidate]
        from google.protobuf import json_format

        step(f"search: measuring {candidate.label()} ({len(self.results) + 1})")
        config = json_format.MessageToJson(candidate_config(self.base_config(candidate.variant), candidate))
        with self.ep.client() as client:
            client.load_model(candidate.variant, config=config, headers=self.ep.admin_headers)
            try:
                row = self._replayed(candidate) if self.load.get("replay") else self._swept(candidate)
            finally:
                client.unload_model(candidate.variant, headers=self.ep.admin_headers)
        accurate, why = accuracy_ok(self.manifest, candidate.variant, variants, self.budgets["accuracy"])
        fast = row["p99_ms"] <= self.budgets["p99_ms"]
        reason = why or ("" if fast else f"p99 {row['p99_ms']:.2f} ms > {self.budgets['p99_ms']:g} ms")
        if row.get("failed"):
            reason = "; ".join(filter(None, [reason, f"{row['failed']} of the replay's requests failed"]))
        if row.get("stable") == "no":  # a busy host: kept, and said so beside the figure
            reason = "; ".join(filter(None, [reason, f"unstable ±{row['spread_pct'] / 2:.0f}%"]))
        feasible = accurate and fast and not row.get("failed")
        objective = "p99" if self.load.get("replay") else "throughput"
        result = Result(candidate, row["throughput"], row["p99_ms"], feasible, reason, objective)
        self.results[candidate] = result
        return result

    def _swept(self, candidate: Candidate) -> dict:
        from tpserve.loadtest.perf.sweep import Sweep, run_sweep

        sweep = Sweep(
            candidate.variant,
            concurrency=(self.load["concurrency"],),
            measurement_ms=self.load["interval_ms"],
            max_trials=10,
            stability_percent=50,
            input_data=self._input_data(candidate.variant),
        )
        (row,) = run_sweep(sweep, self.ep, self.analyzer, self.out / "raw")
        return row

    def _replayed(self, candidate: Candidate) -> dict:
        """The replay's requests sent to this candidate: answered per second, client p99, failed."""
        from tpserve.loadtest.locust_suite.replay import run_replay
        from tpserve.loadtest.reporting.replay_report import percentile

        replay = dataclasses.replace(self.load["replay"], target=candidate.variant)
        out = self.out / "raw" / f"replay-{len(self.results) + 1}"
        sent = run_replay(replay, *self.urls, self.repo, out)["results"]["sent"]
        ok = [s["ms"] for s in sent if s["status"] == "ok"]
        seconds = max((s["sent_s"] for s in sent), default=0.0) or 1.0
        p99 = percentile(ok, 99) if ok else float("inf")
        return {"throughput": len(ok) / seconds, "p99_ms": p99, "failed": len(sent) - len(ok)}


def accuracy_ok(manifest: dict, variant: str, variants: tuple[str, ...], budget: float) -> tuple[bool, str]:
    """Whether the variant's accuracy (manifest) is within budget of the best variant's."""
    scores = {v: manifest.get(v, {}).get("accuracy") for v in variants}
    known = [s for s in scores.values() if s is not None]
    if scores[variant] is None or not known:
        return True, ""
    gap = max(known) - scores[variant]
    return (True, "") if gap <= budget else (False, f"accuracy {scores[variant]:.4f} is {gap:.4f} below the best")


def _score(result: Result) -> float:
    """Feasible ones above the rest; among them the most throughput, or (replays) the lowest p99."""
    if not result.feasible:
        return -1.0 - result.p99_ms / (1.0 + result.p99_ms)
    return result.throughput if result.objective == "throughput" else 1.0 / (1.0 + result.p99_ms)


def exhaustive(space: SearchSpace, searcher: Searcher) -> Result:
    """Measure every candidate; the best feasible one wins."""
    results = [searcher.measure(c, space.variants) for c in space.candidates()]
    return max(results, key=_score)


def quick(space: SearchSpace, searcher: Searcher, start: Candidate | None = None) -> Result:
    """Hill-climb: move to the best neighbour while it improves; stop at a local optimum."""
    current = searcher.measure(start or space.candidates()[0], space.variants)
    while True:
        neighbours = [searcher.measure(n, space.variants) for n in space.neighbours(current.candidate)]
        best = max(neighbours, key=_score, default=current)
        if _score(best) <= _score(current):
            return current
        current = best


def write_back(repo: Path, winner: Candidate, base) -> Path:
    """Write the winner's config into the repository (config.pbtxt of its variant), atomically."""
    import os

    from google.protobuf import text_format

    path = repo / winner.variant / "config.pbtxt"
    partial = path.with_suffix(".partial")
    partial.write_text(text_format.MessageToString(candidate_config(base, winner)))
    os.replace(partial, path)
    return path


def report(results: dict, winner: Result, mode: str, before: Result | None = None) -> str:
    """Every measured candidate, best first, with the verdict; with a replay, the config as built beside."""
    lines = [
        f"## {mode}: {len(results)} candidates measured; best: {winner.candidate.label()} "
        f"({winner.throughput:.1f} infer/s, p99 {winner.p99_ms:.2f} ms)",
        "",
    ]
    if before is not None:
        lines += [
            f"On the replayed traffic: p99 **{before.p99_ms:.2f} ms** with the config as built "
            f"({before.candidate.label()}{'' if before.feasible else '; ' + before.reason}), "
            f"**{winner.p99_ms:.2f} ms** with the best.",
            "",
        ]
    lines += [
        "| candidate | infer/s | p99 ms | feasible | why not |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(results.values(), key=_score, reverse=True):
        lines.append(
            f"| {r.candidate.label()} | {r.throughput:.1f} | {r.p99_ms:.2f} | {'yes' if r.feasible else 'no'} "
            f"| {r.reason} |"
        )
    return "\n".join(lines)


def summary_json(results: dict, winner: Result) -> str:
    """Machine-readable result of a search."""
    rows = [
        {
            "candidate": r.candidate.label(),
            "throughput": r.throughput,
            "p99_ms": r.p99_ms,
            "feasible": r.feasible,
            "reason": r.reason,
        }
        for r in results.values()
    ]
    return json.dumps({"winner": winner.candidate.label(), "measured": len(results), "results": rows}, indent=2)


@dataclass(frozen=True, kw_only=True)
class SearchRun:
    """One `loadtest search`: where, among what, within which budgets, how hard."""

    repo: Path
    out: Path
    variants: tuple[str, ...] = ()  # default: the manifest's first model and its variants
    mode: str = "quick"  # quick, exhaustive or both
    budgets: dict = field(default_factory=dict)  # p99_ms, accuracy
    measure: dict = field(default_factory=dict)  # concurrency, interval_ms, shapes, input_data
    max_instances: int = 2
    delays_us: tuple[int, ...] = DELAYS_US
    write_back: bool = True


def run(request: SearchRun) -> str:
    """Start a server (explicit model control) on free ports, search, stop it, write the winner back and the
    report (search.md, search.json); return the report's text."""
    from tpserve.loadtest.perf.tools import find_perf_analyzer
    from tpserve.server.triton.launcher import running

    request.out.mkdir(parents=True, exist_ok=True)
    with running(request.repo, request.out / "state", model_control="explicit") as state:
        ep = state.endpoint("grpc", request.repo)
        names = request.variants or first_model_variants(request.repo)
        if request.measure.get("replay") and not request.measure["replay"].models:  # the first variant's traffic
            request.measure["replay"] = dataclasses.replace(request.measure["replay"], models=names[:1])
        analyzer = None if request.measure.get("replay") else find_perf_analyzer()
        urls = (state.http_url, state.grpc_url)
        searcher = Searcher(request.repo, ep, analyzer, request.budgets, request.measure, request.out, urls)
        space = SearchSpace(
            names,
            request.max_instances,
            request.delays_us,
            {v: searcher.base_config(v).max_batch_size for v in names},
            frozenset(v for v in names if one_instance_only(searcher.base_config(v))),
        )
        text, winner = _run_modes(space, searcher, request.mode)
    if request.write_back and winner.feasible:
        written = write_back(request.repo, winner.candidate, searcher.base_config(winner.candidate.variant))
        text += f"\n\nwinner written to {written}"
    (request.out / "search.md").write_text(f"# Config search\n\n{text}\n")
    (request.out / "search.json").write_text(summary_json(searcher.results, winner))
    return text


def replay_workload(path: Path, speed: float, seconds: float, model) -> "Replay":
    """The replay a search measures with: a recording (a folder or .jsonl) or a fitted workload (a JSON file),
    its first seconds, the given model's requests only (a name, or a list whose first name; none: all)."""
    from tpserve.loadtest.locust_suite.replay import Replay

    models = tuple(m for m in ([model] if isinstance(model, str) else model[:1]) if m)
    if seconds <= 0:
        raise MeasurementError(f"--replay-seconds {seconds:g}: replay at least part of a second")
    if path.is_file() and path.suffix == ".json":
        return Replay(workload=path, scale=speed, models=models, max_seconds=seconds)
    return Replay(recording=path, speed=speed, models=models, max_seconds=seconds)


def first_model_variants(repo: Path) -> tuple[str, ...]:
    """The manifest's first model and the variants built from it."""
    from tpserve.clients.served import manifest_models, variants_of

    models = manifest_models(repo)
    if not models:
        raise MeasurementError(
            f"{repo} has no manifest.json listing models; build it (make build-engines) or --variants"
        )
    names = tuple(variants_of(repo, models[0]))
    step(f"variants (from {repo}/manifest.json): {' '.join(names)}")
    return names


def _run_modes(space: SearchSpace, searcher: Searcher, mode: str):
    """Run quick and/or exhaustive; in 'both', exhaustive reuses what quick already measured. A replay measures
    the first variant's config as built first, and starts the hill-climb there."""
    sections, winner, before = [], None, None
    if searcher.load.get("replay"):
        variant = space.variants[0]
        before = searcher.measure(as_built(searcher.base_config(variant), variant), space.variants)
    for name in ["quick", "exhaustive"] if mode == "both" else [mode]:
        found = quick(space, searcher, before.candidate if before else None) if name == "quick" else None
        found = found or exhaustive(space, searcher)
        winner = max([found] + ([before] if before else []), key=_score)
        sections.append(report(dict(searcher.results), winner, name, before))
    return "\n\n".join(sections), winner
