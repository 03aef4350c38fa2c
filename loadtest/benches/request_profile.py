"""Where a served request's time goes inside the torch runtime's execute(), step by step.

The server is started with TRITON_TORCH_PROFILE set: each execute of a torch-runtime model appends its
per-step microseconds (GPU synchronized between steps) to a JSON-lines file. Requests are sent one at a
time over gRPC (host memory, no shared memory) so each execute holds one request; the table gives the
median of every step per model and batch.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from common.cli import step

REQUESTS = {1: 200}  # per batch size; larger batches: LARGE_REQUESTS
LARGE_REQUESTS = 12


def profile_requests(repo: Path, models: dict[str, str], batches: tuple[int, ...], out: Path) -> list[dict]:
    """Serve `models` (label -> model) alone with profiling on, send requests, write request_profile.{md,csv}."""
    from server.launcher import running

    if not models:
        return []
    path = out / "request_profile.jsonl"
    path.unlink(missing_ok=True)
    loads = tuple(f"--load-model={m}" for m in models.values())
    state_dir, options = out / "profile_state", {"model_control": "explicit", "extra_args": loads}
    os.environ["TRITON_TORCH_PROFILE"] = str(path)
    try:
        with running(repo, state_dir, startup_timeout=600, **options) as state:
            for label, model in models.items():
                for batch in batches:
                    step(f"request profile: {label}, batch {batch}")
                    _send(state.grpc_url, model, batch, REQUESTS.get(batch, LARGE_REQUESTS))
    finally:
        os.environ.pop("TRITON_TORCH_PROFILE", None)
    rows = summarize(path, {m: label for label, m in models.items()})
    write(rows, out)
    return rows


def _send(url: str, model: str, batch: int, count: int) -> None:
    import numpy as np
    import tritonclient.grpc as grpc

    with grpc.InferenceServerClient(url) as client:
        meta = client.get_model_metadata(model, as_json=True)["inputs"][0]
        shape = [batch, *[int(d) for d in meta["shape"][1:]]]
        tensor = grpc.InferInput(meta["name"], shape, meta["datatype"])
        rng = np.random.default_rng(0)
        data = rng.integers(0, 256, shape, dtype=np.uint8) if meta["datatype"] == "UINT8" else rng.random(shape)
        tensor.set_data_from_numpy(data.astype(grpc_dtype(meta["datatype"])))
        for _ in range(count + 3):  # the first executes warm up
            client.infer(model, [tensor])


def grpc_dtype(datatype: str):
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


def summarize(path: Path, labels: dict[str, str], skip: int = 3) -> list[dict]:
    """Median µs of every step per (model, batch), after the first `skip` executes of each."""
    groups: dict[tuple, list[dict]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        groups.setdefault((record["model"], record["batch"]), []).append(record["steps_us"])
    rows = []
    for (model, batch), records in sorted(groups.items()):
        kept = records[skip:] or records
        steps = {name: statistics.median(r[name] for r in kept if name in r) for name in kept[0]}
        rows.append(
            {
                "model": labels.get(model, model),
                "batch": batch,
                "executes": len(kept),
                "steps_us": steps,
                "total_us": round(sum(steps.values()), 1),
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| request path | batch | executes | step | median µs |", "|---|---:|---:|---|---:|"]
    for row in rows:
        for name, us in row["steps_us"].items():
            lines.append(f"| {row['model']} | {row['batch']} | {row['executes']} | {name} | {us:,.1f} |")
        lines.append(
            f"| {row['model']} | {row['batch']} | {row['executes']} | **total in execute** | "
            f"**{row['total_us']:,.1f}** |"
        )
    return "\n".join(lines)


def write(rows: list[dict], out: Path) -> None:
    import csv

    (out / "request_profile.md").write_text("# Inside execute(), per step\n\n" + markdown(rows) + "\n")
    with open(out / "request_profile.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["request_path", "batch", "executes", "step", "median_us"])
        for row in rows:
            for name, us in row["steps_us"].items():
                writer.writerow([row["model"], row["batch"], row["executes"], name, us])
