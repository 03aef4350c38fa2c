"""One `loadtest perf` run: which models, each one's sweep as the server describes it, the files and the report.

Also what the perf and Locust commands share: the models to measure when none are named, and what was skipped."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpserve.common.cli import step


@dataclass(frozen=True, kw_only=True)
class PerfRequest:
    """What `loadtest perf` measures and how."""

    models: tuple[str, ...] = ()  # none: the served repository's ready models
    protocol: str = "grpc"
    concurrency: tuple[int, ...] = (1, 2, 4)
    request_rate: tuple[float, ...] = ()
    batches: tuple[int, ...] = (1,)
    shared_memory: str = "none"
    interval_ms: int = 2000
    stability: float = 25.0
    shapes: dict = field(default_factory=dict)  # dynamic dims per input (--shape)
    input_data: Path | None = None
    lengths: str = "lognormal"  # token and text models: the length distribution (loadtest/workloads/text.py)
    out: Path = Path("reports")


@dataclass(frozen=True)
class PerfResult:
    """What the command prints and how it exits."""

    text: str  # the table, failed points and what was not measured
    report: Path
    failed: int
    total: int


def served_or_given(models: tuple[str, ...], ep):
    """clients.served.Served of the models given, or of the served repository's ready ones (said where from)."""
    from tpserve.clients.served import read_served

    served = read_served(ep, models)
    if not models:
        step(f"models (from {served.source}): {' '.join(served.names)}")
    return served


def write_skipped(out: Path, served, skipped: dict[str, str]) -> None:
    """skipped.json: models the server's index listed as not ready, with its reason, and those not measured."""
    (out / "skipped.json").write_text(json.dumps({**served.not_ready, **skipped}, indent=2))


def run(request: PerfRequest, ep) -> PerfResult:
    """Sweep every model with perf_analyzer; write perf.csv, perf.md, perf.png, skipped.json and the report."""
    from tpserve.loadtest.perf import sweep as sweeps
    from tpserve.loadtest.perf.tools import find_perf_analyzer
    from tpserve.loadtest.reporting import perf_rows
    from tpserve.loadtest.reporting.plots import throughput_vs_latency
    from tpserve.loadtest.reporting.report import build_report, write_context
    from tpserve.loadtest.reporting.server_view import record_window

    analyzer, out = find_perf_analyzer(), request.out
    rows: list[dict] = []
    failures: list = []
    skipped: dict[str, str] = {}
    started = time.time()
    served = served_or_given(request.models, ep)
    names = list(served.names)
    for model in names:
        sweep = model_sweep(request, ep, served.spec(model), model, skipped)
        if sweep is not None:
            rows += sweeps.run_sweep(sweep, ep, analyzer, out / "raw", failures)
    record_window(out, started, time.time())
    perf_rows.write_csv(rows, out / "perf.csv")
    table, failed = perf_rows.markdown_table(rows), sweeps.failures_table(failures)
    notes = "".join(f"- {m}: {why}\n" for m, why in skipped.items())
    extra = (f"\n## Failed points\n\n{failed}\n" if failed else "") + (f"\n## Not measured\n\n{notes}" if notes else "")
    (out / "perf.md").write_text(f"# perf_analyzer sweep\n\n{table}\n{extra}")
    write_skipped(out, served, skipped)
    failed_points = [  # the report shows them with why (a run of failures only is not "no points")
        {"model": f.model, "point": f"b{f.batch} {f.load} {f.level}", "why": f.message.splitlines()[0]}
        for f in failures
    ]
    (out / "failed.json").write_text(json.dumps(failed_points, indent=2))
    if rows:
        throughput_vs_latency(rows, out / "perf.png")
    write_context(out, ep, names)
    report = build_report(out, ep.repo, comparable_earlier(out))
    return PerfResult(table + (f"\n{extra}" if extra else ""), report, len(failures), len(failures) + len(rows))


def model_sweep(request: PerfRequest, ep, spec, model: str, skipped: dict):
    """The sweep of one model as the server describes it (spec: ours, or None), or None (the reason goes to
    skipped)."""
    from tpserve.clients.model_plan import NotMeasurable, plan
    from tpserve.loadtest.perf import sweep as sweeps

    with ep.client() as client:
        model_plan = plan(client, model, ep.headers)
    batches = request.batches
    if not model_plan.batching and max(batches) > 1:
        batches = (1,)
        skipped[f"{model} batch > 1"] = "max_batch_size is 0 (no batch axis): measured at batch 1 only"
    try:
        model_plan.require_protocol(request.protocol)
        path = request.out / "raw" / f"{model}_input.json"
        data, shapes = _workload(request, spec, model_plan, batches, path)
        if data is None:
            largest = min(max(batches), model_plan.max_batch_size or 1)
            data = sweeps.input_data_file(ep, model, path, request.shapes, request.input_data, spec, largest)
    except NotMeasurable as err:
        skipped[model] = str(err).removeprefix(f"{model}: ")
        step(f"not measured: {err}")
        return None
    return sweeps.Sweep(
        model,
        protocol=request.protocol,
        concurrency=request.concurrency,
        request_rates=request.request_rate,
        batch_sizes=batches,
        shared_memory=request.shared_memory,
        measurement_ms=request.interval_ms,
        stability_percent=request.stability,
        input_data=data,
        streaming=model_plan.decoupled,
        shapes=shapes,
    )


def _workload(request: PerfRequest, spec, model_plan, batches, path: Path) -> tuple[Path | None, str]:
    """A token or text model without the user's data or --shape: requests drawn from a length distribution
    (their description goes into the report); other models: (None, "")."""
    from tpserve.loadtest.workloads import text as tw

    if request.input_data or request.shapes or not (model_plan.token_inputs or model_plan.text_input):
        return None, ""
    lengths = tw.Lengths.parse(
        request.lengths, longest=tw.spec_longest(spec, model_plan), shortest=tw.spec_shortest(spec, model_plan)
    )
    return tw.workload_data(model_plan, lengths, max(batches), path, spec=spec)


def comparable_earlier(run_dir: Path) -> Path | None:
    """The latest earlier run beside run_dir that measured one of its points (like with like), or None."""
    from tpserve.loadtest.reporting.report import comparable_run

    earlier = [
        p for p in run_dir.parent.iterdir() if p != run_dir and (p / "perf.csv").exists() and p.name < run_dir.name
    ]
    return comparable_run(run_dir, earlier)
