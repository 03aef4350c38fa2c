"""What bounds single sentences and raw text on a GPU host: one build, two servers (Triton's latency summaries on,
then off), the engine beside its echo (an engine that does nothing, served the same way) at single sentences,
and the text pipeline with its tokenize step laid out three ways (one instance of four children, one of eight,
two of four). Each point is text-bench's own (the same client, lengths and texts).

    .venv/bin/python -m benchmarks.serving_bounds --tokenizer tokenizer.json --out reports/bounds

Writes bounds.jsonl (a line a point, as measured) and bounds.md. docs/gpu/serving_bounds_h200.md holds a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

from tpserve.builders.repository.model_config import parse_pbtxt, proto_to_pbtxt

LAYOUTS = {"1x4": (1, 4), "1x8": (1, 8), "2x4": (2, 4)}  # tokenize step: instances x children


def _relabel(repo: Path, source: str, target: str, edit) -> None:
    """source's folder copied as target, its config parsed, renamed, changed by edit(message) and written back."""
    shutil.copytree(repo / source, repo / target)
    path = repo / target / "config.pbtxt"
    config = parse_pbtxt(path.read_text())
    config.name = target
    edit(config)
    path.write_text(proto_to_pbtxt(config))


def _layout(instances: int, children: int):
    def edit(config) -> None:
        config.parameters["tokenize_processes"].string_value = str(children)
        config.instance_group[0].count = instances

    return edit


def _step_to(model: str):
    def edit(config) -> None:
        config.ensemble_scheduling.step[0].model_name = model

    return edit


def add_layouts(repo: Path, engine: str, pipeline: str) -> dict[str, str]:
    """A tokenize step and a pipeline per layout beside the built ones; returns layout -> pipeline name."""
    tokenize, names = f"{engine}_tokenize", {}
    for label, (instances, children) in LAYOUTS.items():
        _relabel(repo, tokenize, f"{tokenize}_{label}", _layout(instances, children))
        _relabel(repo, pipeline, f"{pipeline}_{label}", _step_to(f"{tokenize}_{label}"))
        names[label] = f"{pipeline}_{label}"
    return names


def main(argv: list[str] | None = None) -> int:
    from tpserve.loadtest.benches import text_bench as tb
    from tpserve.loadtest.workloads import text as tw
    from tpserve.server.triton.launcher import TritonTuning, running

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("reports") / time.strftime("bounds-%Y%m%d-%H%M%S"))
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    settings = tb.for_device(tb.TextBenchSettings(tokenizer=args.tokenizer, lengths=("lognormal",)), True)
    spec, models = tb.build(settings, out / "work", out / "repo", True)
    layouts = add_layouts(out / "repo", models["engine"], models["pipeline"])
    lengths = tw.Lengths.parse("lognormal", longest=spec.longest_sequence()).sample(settings.sentences)
    words, zipf = tb.text_words(settings)
    stats, rows = tb.RaggedStats(out / "ragged_stats"), []

    def measure(ep, label: str, model: str, per_request: int, concurrency: int, text: bool = False) -> None:
        point = tb.Point(
            path="served text" if text else "served ids",
            model=model,
            encoder=models["engine"],
            per_request=per_request,
            concurrency=concurrency,
            words=words,
            zipf=zipf,
        )
        row = tb._safe_point(point, ep, None, lengths, "lognormal", stats, out / "raw")
        record = {"servers": label, **dataclasses.asdict(row)}
        record.pop("extra", None)
        rows.append(record)
        with (out / "bounds.jsonl").open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    for summaries in (True, False):
        label = f"summaries {'on' if summaries else 'off'}"
        tuning = TritonTuning(latency_summaries=summaries)
        with running(out / "repo", out / f"state_{summaries}", startup_timeout=900, tuning=tuning) as state:
            ep = state.endpoint("grpc", out / "repo")
            measure(ep, label, models["echo"], 1, 256)
            measure(ep, label, models["engine"], 1, 256)
            if summaries:
                for name in layouts.values():
                    measure(ep, label, name, settings.per_request, 128, text=True)
    (out / "bounds.md").write_text(markdown(rows))
    print((out / "bounds.md").read_text())
    return 0


def markdown(rows: list[dict]) -> str:
    lines = ["| servers | model | per request | concurrency | sentences/s | p50 ms | p99 ms | mean batch | note |"]
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        rate = f"{r['sentences_s']:,.0f}" if r["sentences_s"] else "—"
        p50 = f"{r['p50_ms']:.2f}" if r["p50_ms"] else "—"
        p99 = f"{r['p99_ms']:.2f}" if r["p99_ms"] else "—"
        batch = f"{r['mean_batch']:.1f}" if r["mean_batch"] else "—"
        lines.append(
            f"| {r['servers']} | {r['runtime']} | {r['per_request']} | {r['concurrency']} | {rate} | {p50} | {p99} "
            f"| {batch} | {r['note']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
