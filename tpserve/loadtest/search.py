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
    level: int = 0  # the concurrency the figures are taken at (the best within the latency budget)
    low: float = 0.0  # the throughput's range over the repeats at that level: what noise alone moves it by
    high: float = 0.0
    points: tuple = ()  # (concurrency, median throughput, median p99 ms, spread %) per level swept


def level_points(runs: list[list[dict]]) -> list[dict]:
    """Repeated sweeps (each a row per concurrency level) as one point per level: median throughput and p99, the
    throughput's range, its spread in percent of the median."""
    import statistics

    levels = sorted({row["level"] for rows in runs for row in rows})
    points = []
    for level in levels:
        rows = [row for rows in runs for row in rows if row["level"] == level]
        throughputs = [row["throughput"] for row in rows]
        median = statistics.median(throughputs)
        points.append(
            {
                "level": level,
                "throughput": median,
                "p99_ms": statistics.median(row["p99_ms"] for row in rows),
                "low": min(throughputs),
                "high": max(throughputs),
                "spread_pct": 100 * (max(throughputs) - min(throughputs)) / median if median else 0.0,
                "repeats": len(rows),
            }
        )
    return points


def best_point(points: list[dict], p99_budget_ms: float) -> dict:
    """The level with the most throughput within the latency budget; where none is within, the lowest p99."""
    within = [p for p in points if p["p99_ms"] <= p99_budget_ms]
    return max(within, key=lambda p: p["throughput"]) if within else min(points, key=lambda p: p["p99_ms"])


def within_noise(results: dict, winner: Result) -> list[Result]:
    """Feasible candidates whose throughput range over the repeats overlaps the winner's: the measurement cannot
    tell them from it."""
    if winner.objective != "throughput" or not winner.high:
        return []
    return [
        r
        for r in results.values()
        if r is not winner and r.feasible and r.high >= winner.low and r.candidate != winner.candidate
    ]


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


class Checkpoint:
    """Every measured candidate's row, appended as it is measured (checkpoint.jsonl, its first line the settings
    measured with): a search cut short resumes where it stopped, and a finished one is judged again under new
    budgets (--reanalyse) in seconds, without a server. A checkpoint of other settings is set aside, not mixed in."""

    def __init__(self, path: Path, settings: dict, resume: bool = True):
        self.path, self.rows = path, {}
        settings = json.loads(json.dumps(settings, default=str))
        if resume and path.exists():
            lines = read_checkpoint(path)
            if lines and lines[0].get("settings") == settings:
                self.rows = {line["label"]: line["row"] for line in lines[1:]}
                step(f"search: resuming from {path} ({len(self.rows)} candidates measured)")
            elif lines:
                step(f"search: {path} was measured with other settings; it is kept as {path.name}.old")
                path.replace(path.with_name(path.name + ".old"))
        if not self.rows:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"settings": settings}) + "\n")

    def get(self, label: str) -> dict | None:
        return self.rows.get(label)

    def add(self, candidate: Candidate, row: dict) -> None:
        self.rows[candidate.label()] = row
        line = {"label": candidate.label(), "candidate": dataclasses.asdict(candidate), "row": row}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(line, default=str) + "\n")


def read_checkpoint(path: Path) -> list[dict]:
    """A checkpoint's lines: the settings, then one per measured candidate (a line cut short by a stop: left out).

    Raises:
        MeasurementError: no checkpoint there.
    """
    if not path.exists():
        raise MeasurementError(f"no search checkpoint at {path}: run the search with --out {path.parent} first")
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


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
        self.checkpoint: Checkpoint | None = None

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
        row = self.checkpoint.get(candidate.label()) if self.checkpoint else None
        if row is None:
            row = self._measured(candidate)
            if self.checkpoint is not None:
                self.checkpoint.add(candidate, row)
        else:
            step(f"search: {candidate.label()} measured before (checkpoint): reused")
        result = judge(candidate, row, self.budgets, self.manifest, variants, "p99" if self.load.get("replay") else "")
        self.results[candidate] = result
        return result

    def _measured(self, candidate: Candidate) -> dict:
        from google.protobuf import json_format

        step(f"search: measuring {candidate.label()} ({len(self.results) + 1})")
        config = json_format.MessageToJson(candidate_config(self.base_config(candidate.variant), candidate))
        with self.ep.client() as client:
            client.load_model(candidate.variant, config=config, headers=self.ep.admin_headers)
            try:
                return self._replayed(candidate) if self.load.get("replay") else self._swept(candidate)
            finally:
                client.unload_model(candidate.variant, headers=self.ep.admin_headers)

    def _swept(self, candidate: Candidate) -> dict:
        """perf_analyzer over the concurrency levels, repeated: the best level within the budget, with its range."""
        from tpserve.loadtest.perf.sweep import Sweep, run_sweep

        levels = self.load["concurrency"]
        sweep = Sweep(
            candidate.variant,
            concurrency=tuple(levels) if isinstance(levels, (tuple, list)) else (levels,),
            measurement_ms=self.load["interval_ms"],
            max_trials=10,
            stability_percent=50,
            input_data=self._input_data(candidate.variant),
        )
        repeats = max(1, int(self.load.get("repeats", 1)))
        runs = [run_sweep(sweep, self.ep, self.analyzer, self.out / "raw") for _ in range(repeats)]
        points = level_points(runs)
        best = best_point(points, self.budgets["p99_ms"])
        unstable = any(row.get("stable") == "no" for rows in runs for row in rows)
        return {**best, "points": points, "stable": "no" if unstable else "yes"}

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


def judge(candidate: Candidate, row: dict, budgets: dict, manifest: dict, variants, objective: str = "") -> Result:
    """A candidate's measured row against the budgets (latency, accuracy): a result, feasible or with why not.
    Measuring and judging are apart, so that a checkpoint is judged again under new budgets without a server: a
    swept candidate's level is picked again among its points under the latency budget given."""
    if row.get("points"):
        row = {**row, **best_point(row["points"], budgets["p99_ms"])}
    accurate, why = accuracy_ok(manifest, candidate.variant, variants, budgets["accuracy"])
    fast = row["p99_ms"] <= budgets["p99_ms"]
    reason = why or ("" if fast else f"p99 {row['p99_ms']:.2f} ms > {budgets['p99_ms']:g} ms")
    if row.get("failed"):
        reason = "; ".join(filter(None, [reason, f"{row['failed']} of the replay's requests failed"]))
    if row.get("spread_pct", 0) > 10:  # a busy host: kept, and said so beside the figure
        reason = "; ".join(filter(None, [reason, f"noisy: ±{row['spread_pct'] / 2:.0f}% over the repeats"]))
    elif row.get("stable") == "no":
        reason = "; ".join(filter(None, [reason, "perf_analyzer could not stabilize"]))
    points = tuple(tuple(p[k] for k in ("level", "throughput", "p99_ms", "spread_pct")) for p in row.get("points", ()))
    return Result(
        candidate,
        row["throughput"],
        row["p99_ms"],
        accurate and fast and not row.get("failed"),
        reason,
        objective or "throughput",
        level=int(row.get("level", 0)),
        low=row.get("low", row["throughput"]),
        high=row.get("high", row["throughput"]),
        points=points,
    )


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
    """Every measured candidate, best first, with the verdict and the repeats' range; which candidates the
    measurement cannot tell from the best; with a replay, the config as built beside."""
    at = f" at concurrency {winner.level}" if winner.level else ""
    lines = [
        f"## {mode}: {len(results)} candidates measured; best: {winner.candidate.label()} "
        f"({winner.throughput:.1f} infer/s{at}, p99 {winner.p99_ms:.2f} ms)",
        "",
    ]
    tied = within_noise(results, winner)
    if winner.objective == "throughput" and winner.high:
        lines += [
            (
                f"Within the best's noise (throughput ranges over the repeats overlap): "
                f"{', '.join(r.candidate.label() for r in tied)}. Any of them may win a rerun."
                if tied
                else "No other feasible candidate's range over the repeats reaches the best's: its lead is beyond "
                "the noise measured."
            ),
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
        "| candidate | infer/s | range over repeats | at concurrency | p99 ms | feasible | why not |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results.values(), key=_score, reverse=True):
        spread = f"{r.low:.1f}-{r.high:.1f}" if r.high and r.high != r.low else "—"
        lines.append(
            f"| {r.candidate.label()} | {r.throughput:.1f} | {spread} | {r.level or '—'} | {r.p99_ms:.2f} "
            f"| {'yes' if r.feasible else 'no'} | {r.reason} |"
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
            "level": r.level,
            "range": [r.low, r.high],
            "points": [dict(zip(("level", "throughput", "p99_ms", "spread_pct"), p)) for p in r.points],
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
    resume: bool = True  # reuse what a checkpoint of the same settings in out measured


def _settings(request: SearchRun, names: tuple[str, ...]) -> dict:
    """What a checkpoint's rows were measured with: resuming under other settings would mix two searches."""
    measure = {k: v for k, v in request.measure.items() if k != "replay"}
    replay = request.measure.get("replay")
    return {"repo": str(request.repo), "variants": names, "measure": measure, "replay": repr(replay) if replay else ""}


def run(request: SearchRun) -> str:
    """Start a server (explicit model control) on free ports, search, stop it, write the winner back and the
    report (search.md, search.json, search.png, checkpoint.jsonl); return the report's text."""
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
        searcher.checkpoint = Checkpoint(request.out / "checkpoint.jsonl", _settings(request, names), request.resume)
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
    return _write_report(request.out, searcher.results, winner, text)


def _write_report(out: Path, results: dict, winner: Result, text: str) -> str:
    plot(results, winner, out / "search.png")
    (out / "search.md").write_text(f"# Config search\n\n{text}\n\n![throughput against p99](search.png)\n")
    (out / "search.json").write_text(summary_json(results, winner))
    return text


def reanalyse(out: Path, repo: Path, budgets: dict) -> str:
    """Judge a finished (or cut short) search's checkpoint again under new budgets, without a server; rewrite its
    report. The winner is not written back (a search that measured writes back)."""
    from tpserve.builders.repository.manifest import read_manifest

    lines = read_checkpoint(out / "checkpoint.jsonl")
    measured = [line for line in lines[1:] if "candidate" in line]
    if not measured:
        raise MeasurementError(f"{out / 'checkpoint.jsonl'} holds no measured candidate yet")
    manifest = read_manifest(repo)["models"]
    variants = tuple(lines[0]["settings"].get("variants", ()))
    objective = "p99" if lines[0]["settings"].get("replay") else ""
    results = {}
    for line in measured:
        given = {**line["candidate"], "preferred": tuple(line["candidate"]["preferred"])}
        candidate = Candidate(**given)
        results[candidate] = judge(
            candidate, line["row"], budgets, manifest, variants or (candidate.variant,), objective
        )
    winner = max(results.values(), key=_score)
    text = report(
        results, winner, f"re-analysed (p99 ≤ {budgets['p99_ms']:g} ms, accuracy within {budgets['accuracy']:g})"
    )
    return _write_report(out, results, winner, text)


def plot(results: dict, winner: Result, path: Path) -> Path | None:
    """Each candidate's throughput against p99 over the concurrency levels swept (the winner drawn thick);
    nothing where no candidate was swept (a replay measures one point)."""
    from tpserve.loadtest.reporting.plots import pyplot, save

    swept = [r for r in results.values() if r.points]
    if not swept:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in sorted(swept, key=_score, reverse=True):
        xs, ys = [p[2] for p in r.points], [p[1] for p in r.points]
        mine = r is winner
        ax.plot(
            xs,
            ys,
            marker="o",
            linewidth=2.5 if mine else 1,
            alpha=1 if mine else 0.6,
            label=f"{r.candidate.label()}{' (best)' if mine else ''}",
        )
        for level, x, y in zip((p[0] for p in r.points), xs, ys):
            ax.annotate(f"c{level}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    ax.set_xlabel("p99 latency (ms, median over repeats)")
    ax.set_ylabel("throughput (infer/s, median over repeats)")
    ax.set_title("Config search: each candidate over its concurrency levels")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    return save(fig, path)


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
