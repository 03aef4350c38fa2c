"""What a run costs a ragged batch on a GPU: the served engine's runner in-process, batches of N sentences taken in
arrival order (lognormal lengths), planned three ways: each run at least min_run_tokens (`max(floor, tokens)`, the
plan before 2026-11-28), each run min_run_tokens more than its tokens (`floor + tokens`, ragged.run_cost now; also
at twice the measured floor), and every sentence in one run at the batch's longest length. Prints runs per batch,
ms per batch and sentences/s for each; a line a point in plan_cost.jsonl, a table in plan_cost.md, a plot.

    .venv/bin/python -m benchmarks.ragged_plan_cost --out reports/plan_cost

docs/gpu/ragged_plan_cost_h200.md holds a run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SIZES = (4, 8, 16, 32, 64, 128, 256)
BATCHES = 64  # batches timed per point


def capped_cost(rows: int, length: int, grid, min_run_tokens: int) -> int:
    """The cost the plan used before: each run at least min_run_tokens."""
    cap = grid.rows_for(length)
    full, rest = divmod(rows, cap)
    cost = full * max(min_run_tokens, cap * length)
    return cost + (max(min_run_tokens, grid.batch_bucket(rest) * length) if rest else 0)


def variants(floor: int) -> list[tuple[str, str, int]]:
    """(label, cost model, min_run_tokens): 'max' is capped_cost, 'sum' ragged.run_cost."""
    return [
        ("max(floor, tokens)", "max", floor),
        ("floor + tokens", "sum", floor),
        ("2 floor + tokens", "sum", 2 * floor),
        ("one run", "max", 10**9),
    ]


def _runner(work: Path):
    """The text-bench spec's model built, then its served engine's runner compiled in-process (fp16)."""
    import torch

    from tpserve.builders.formats.torch_compiled import ragged_engine
    from tpserve.builders.repository.writer import TorchRuntime
    from tpserve.loadtest.benches import text_bench as tb
    from tpserve.triton_models.runtime import torch_runtime as rt

    settings = tb.for_device(tb.TextBenchSettings(lengths=("lognormal",)), True)
    spec, _ = tb.build(settings, work / "work", work / "repo", True)
    program = work / "work" / spec.name / "model.pt2"
    runtime = TorchRuntime(precision="fp16", cuda_graphs=True, compiler="inductor")
    module = rt.compiled(rt.load_program(program, "cuda").to("cuda", dtype=torch.float16))
    return spec, ragged_engine(module, spec, runtime, "cuda").runner


def _batches(lengths: np.ndarray, rows: int):
    from tpserve.loadtest.workloads import text as tw
    from tpserve.triton_models.runtime import ragged

    ids, mask = tw.token_rows(lengths)
    picks = [np.arange(start, start + rows) % len(lengths) for start in range(0, BATCHES * rows, rows)]
    names = ["input_ids", "attention_mask"]
    made = []
    for picked in picks:
        width = int(lengths[picked].max())
        made.append(
            ragged.RaggedBatch(
                [{"input_ids": ids[picked, :width], "attention_mask": mask[picked, :width]}], names, "attention_mask"
            )
        )
    return picks, made


def measure(runner, lengths: np.ndarray, rows: int, model: str, floor: int) -> dict:
    import torch

    from tpserve.triton_models.runtime import ragged

    kept = ragged.run_cost
    ragged.run_cost, runner.min_run_tokens = (capped_cost if model == "max" else kept), floor
    try:
        picks, batches = _batches(lengths, rows)
        runs = [len(ragged.plan(lengths[p], runner.grid, floor)) for p in picks]
        for batch in batches[:4]:
            runner(batch)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in batches:
            runner(batch)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / len(batches) * 1e3
    finally:
        ragged.run_cost = kept
    return {
        "rows": rows,
        "model": model,
        "floor": floor,
        "runs": float(np.mean(runs)),
        "ms_per_batch": round(ms, 3),
        "per_s": round(rows / ms * 1e3),
    }


def markdown(points: list[dict], floor: int, host: str) -> str:
    labels = {(m, f): label for label, m, f in variants(floor)}
    head = "| sentences per batch | " + " | ".join(label for label, _, _ in variants(floor)) + " |"
    lines = [
        f"Host: {host}; measured floor {floor} tokens (the smallest run's time at the largest run's rate).",
        "",
        "Sentences/s (runs per batch, ms per batch):",
        "",
        head,
        "|---:|" + "---:|" * len(variants(floor)),
    ]
    for rows in sorted({p["rows"] for p in points}):
        cells = {labels[(p["model"], p["floor"])]: p for p in points if p["rows"] == rows}
        row = [
            f"{cells[label]['per_s']:,} ({cells[label]['runs']:.1f}, {cells[label]['ms_per_batch']:.2f})"
            for label, _, _ in variants(floor)
        ]
        lines.append(f"| {rows} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot(points: list[dict], floor: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, model, at in variants(floor):
        mine = sorted((p for p in points if p["model"] == model and p["floor"] == at), key=lambda p: p["rows"])
        ax.plot([p["rows"] for p in mine], [p["per_s"] for p in mine], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sentences per batch (arrival order, lognormal lengths)")
    ax.set_ylabel("sentences/s in-process")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("reports/plan_cost"))
    args = parser.parse_args()
    import torch

    from tpserve.loadtest.workloads import text as tw

    args.out.mkdir(parents=True, exist_ok=True)
    spec, runner = _runner(args.out / "build")
    floor = runner.min_run_tokens
    lengths = tw.Lengths.parse("lognormal", longest=spec.longest_sequence()).sample(8192)
    points = []
    for rows in SIZES:
        for label, model, at in variants(floor):
            points.append(measure(runner, lengths, rows, model, at))
            print(json.dumps({"plan": label, **points[-1]}), flush=True)
            with (args.out / "plan_cost.jsonl").open("a") as f:
                f.write(json.dumps(points[-1]) + "\n")
    host = torch.cuda.get_device_name()
    (args.out / "plan_cost.md").write_text(markdown(points, floor, host))
    plot(points, floor, args.out / "plan_cost.png")
    print((args.out / "plan_cost.md").read_text())


if __name__ == "__main__":
    main()
