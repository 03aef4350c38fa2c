"""perf_analyzer sweeps over concurrency, request rate and batch size, parsed into one tidy table."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from builders.cli_support import step
from builders.errors import MeasurementError
from clients.connection import Endpoint
from loadtest.perf_tools import PerfAnalyzer

SHARED_MEMORY = ("none", "system", "cuda")
COLUMNS = (
    "model", "protocol", "batch", "load", "level", "throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms",
    "avg_ms", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us", "network_us",
)  # fmt: skip


@dataclass(frozen=True)
class Sweep:
    """One model's sweep: load levels (concurrency or request rate) × batch sizes."""

    model: str
    protocol: str = "grpc"
    concurrency: tuple[int, ...] = (1, 2, 4)
    request_rates: tuple[float, ...] = ()
    batch_sizes: tuple[int, ...] = (1,)
    shared_memory: str = "none"
    measurement_ms: int = 2000
    max_trials: int = 5
    stability_percent: float = 10.0  # perf_analyzer's default; looser on busy hosts
    output_shm_bytes: int = 0  # per output region with shared memory (0: perf_analyzer's default)
    input_data: Path | None = None  # perf_analyzer --input-data JSON (real payloads for BYTES inputs)

    def __post_init__(self):
        if self.shared_memory not in SHARED_MEMORY:
            raise MeasurementError(f"shared_memory {self.shared_memory!r} unknown; expected one of {SHARED_MEMORY}")
        if not self.concurrency and not self.request_rates:
            raise MeasurementError("give at least one concurrency level or request rate")
        if min(self.batch_sizes, default=0) < 1:
            raise MeasurementError(f"batch sizes {list(self.batch_sizes)} must be >= 1")

    def loads(self) -> list[tuple[str, str]]:
        """(kind, value) for every load level: ('concurrency', '4') or ('request_rate', '200')."""
        levels = [("concurrency", str(c)) for c in self.concurrency]
        return levels + [("request_rate", f"{r:g}") for r in self.request_rates]


def perf_args(sweep: Sweep, ep: Endpoint, batch: int, load: tuple[str, str], csv_path: Path) -> list[str]:
    """perf_analyzer's command line for one batch size and one load level."""
    kind, value = load
    args = [
        "-m", sweep.model, "-u", ep.url, "-i", ep.protocol, "-b", str(batch),
        f"--{kind.replace('_', '-')}-range", value,
        "--measurement-interval", str(sweep.measurement_ms), "--max-trials", str(sweep.max_trials),
        "--stability-percentage", f"{sweep.stability_percent:g}",
        "-f", str(csv_path), "--verbose-csv",
    ]  # fmt: skip
    if sweep.input_data is not None:
        args += ["--input-data", str(sweep.input_data)]
    if sweep.shared_memory != "none":
        args += ["--shared-memory", sweep.shared_memory]
        if sweep.output_shm_bytes:
            args += ["--output-shared-memory-size", str(sweep.output_shm_bytes)]
    for key, val in ep.admin_headers.items():  # perf_analyzer reads the (restricted) statistics API
        args += ["-H", f"{key}:{val}"]
    return args


def input_data_file(ep: Endpoint, model: str, path: Path) -> Path | None:
    """perf_analyzer input data: real payloads for BYTES inputs (an image, a text), and for integer
    inputs or dynamic dims values and lengths from the model's spec (e.g. token ids within the
    vocabulary). None where perf_analyzer's own random data fits (fixed-shape float inputs only).
    """
    import base64
    import json
    import struct

    from clients.infer import model_inputs
    from clients.inputs import example_input
    from clients.served import served_spec

    with ep.client() as client:
        inputs = model_inputs(client, model)
    if all(m["datatype"] in ("FP32", "FP16") and -1 not in m["shape"][1:] for m in inputs):
        return None
    spec, sample = served_spec(ep.repo, model), {}
    for i, meta in enumerate(inputs):
        array = example_input(meta, 1, i, spec)[0]  # one sample, without the batch axis
        if meta["datatype"] == "BYTES":
            # b64 holds the serialized BYTES tensor: a little-endian uint32 length before each element
            blob = b"".join(struct.pack("<I", len(item)) + item for item in array.flat)
            sample[meta["name"]] = {"b64": base64.b64encode(blob).decode(), "shape": list(array.shape)}
        else:
            sample[meta["name"]] = {"content": array.reshape(-1).tolist(), "shape": list(array.shape)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": [sample]}))
    return path


def parse_csv(path: Path, sweep: Sweep, batch: int, kind: str) -> list[dict]:
    """perf_analyzer's --verbose-csv output → tidy rows (latencies in ms, server breakdown in µs)."""
    with open(path, newline="") as handle:
        records = list(csv.DictReader(handle))
    if not records:
        raise MeasurementError(f"perf_analyzer wrote no measurement to {path}")
    return [_row(r, sweep, batch, kind) for r in records]


def _row(record: dict, sweep: Sweep, batch: int, kind: str) -> dict:
    level = record.get("Concurrency") or record.get("Request Rate")
    ms = lambda key: round(float(record[key]) / 1000, 3)  # noqa: E731
    return {
        "model": sweep.model,
        "protocol": sweep.protocol,
        "batch": batch,
        "load": kind,
        "level": float(level),
        "throughput": float(record["Inferences/Second"]),
        "p50_ms": ms("p50 latency"),
        "p90_ms": ms("p90 latency"),
        "p95_ms": ms("p95 latency"),
        "p99_ms": ms("p99 latency"),
        "avg_ms": ms("Avg latency"),
        "queue_us": float(record["Server Queue"]),
        "compute_input_us": float(record["Server Compute Input"]),
        "compute_infer_us": float(record["Server Compute Infer"]),
        "compute_output_us": float(record["Server Compute Output"]),
        "network_us": float(record["Network+Server Send/Recv"]),
    }


def run_sweep(sweep: Sweep, ep: Endpoint, analyzer: PerfAnalyzer, work_dir: Path) -> list[dict]:
    """Run every (batch, load) point of a sweep; one progress line per point."""
    work_dir.mkdir(parents=True, exist_ok=True)
    rows, points = [], [(b, load) for b in sweep.batch_sizes for load in sweep.loads()]
    for i, (batch, load) in enumerate(points, start=1):
        step(f"perf [{i}/{len(points)}] {sweep.model} {ep.protocol} batch {batch} {load[0]} {load[1]}")
        csv_path = work_dir / f"{sweep.model}_{ep.protocol}_b{batch}_{load[0]}_{load[1]}.csv"
        timeout = 60 + sweep.measurement_ms / 1000 * sweep.max_trials * 3
        analyzer.run(perf_args(sweep, ep, batch, load, csv_path), timeout)
        rows += parse_csv(csv_path, sweep, batch, load[0])
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    """Write rows with the tidy COLUMNS."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    """Rows written by write_csv, with their numbers typed again (empty if there is no file)."""
    if not path.exists():
        return []
    text = ("model", "protocol", "load")
    with open(path, newline="") as handle:
        return [{k: v if k in text else (int(v) if k == "batch" else float(v)) for k, v in r.items()}
                for r in csv.DictReader(handle)]  # fmt: skip


def markdown_table(rows: list[dict]) -> str:
    """The rows as a markdown table people read."""
    head = "| model | proto | batch | load | throughput (infer/s) | p50 ms | p99 ms | queue µs | infer µs |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['protocol']} | {r['batch']} | {r['load']} {r['level']:g} | {r['throughput']:.1f} "
            f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['queue_us']:.0f} | {r['compute_infer_us']:.0f} |"
        )
    return "\n".join(lines)
