"""perf_analyzer sweeps over concurrency, request rate and batch size, parsed into one tidy table."""

from __future__ import annotations

import base64
import csv
import json
import re
import struct
from dataclasses import KW_ONLY, dataclass, replace
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.perf.tools import PerfAnalyzer
from tpserve.server.triton.preloads import PLACEHOLDER

SHARED_MEMORY = ("none", "system", "cuda")
# perf_analyzer's words when its windows disagree, or when one was too short to hold a request (a busy host)
UNSTABLE = ("Failed to obtain stable measurement", "Please use a larger time window")
PASS_LINE = re.compile(r"Pass \[\d+\] throughput: ([0-9.eE+-]+) infer/sec\. Avg latency: (\d+) usec")
ACCEPT_ANY = 1000.0  # --stability-percentage that takes the first windows as they come (last resort)


@dataclass(frozen=True)
class Sweep:
    """One model's sweep: load levels (concurrency or request rate) × batch sizes."""

    model: str
    _: KW_ONLY
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
    streaming: bool = False  # decoupled models: gRPC streaming (perf_analyzer --streaming)
    shapes: str = ""  # what the requests hold, for the report (a text workload's length distribution)

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
    url = f"https://{ep.url}" if ep.tls and ep.protocol == "http" else ep.url
    args = [
        "-m",
        sweep.model,
        "-u",
        url,
        "-i",
        ep.protocol,
        "-b",
        str(batch),
        f"--{kind.replace('_', '-')}-range",
        value,
        "--measurement-interval",
        str(sweep.measurement_ms),
        "--max-trials",
        str(sweep.max_trials),
        "--stability-percentage",
        f"{sweep.stability_percent:g}",
        "-f",
        str(csv_path),
        "--verbose-csv",
        "-v",
    ]
    if sweep.input_data is not None:
        args += ["--input-data", str(sweep.input_data)]
    if sweep.streaming:
        args += ["--streaming"]
    args += tls_args(ep)
    for key, val in ep.headers.items():  # a gateway's headers (an admin key among them goes below, not here)
        if key not in ep.admin_headers:
            args += ["-H", f"{key}:{val}"]
    if sweep.shared_memory != "none":
        args += ["--shared-memory", sweep.shared_memory]
        if sweep.output_shm_bytes:
            args += ["--output-shared-memory-size", str(sweep.output_shm_bytes)]
    for key in ep.admin_headers:  # perf_analyzer reads the (restricted) statistics API; the key itself
        args += ["-H", f"{key}:{PLACEHOLDER}"]  # goes through a pipe, never argv (server/triton/preloads.py)
    return args


def tls_args(ep: Endpoint) -> list[str]:
    """perf_analyzer's TLS flags for an endpoint (none without TLS)."""
    if not ep.tls:
        return []
    if ep.protocol == "grpc":
        roots = ["--ssl-grpc-root-certifications-file", ep.ca_file] if ep.ca_file else []
        return ["--ssl-grpc-use-ssl", "true", *roots]
    found = ["--ssl-https-verify-peer", "1", "--ssl-https-verify-host", "2"]
    return found + (["--ssl-https-ca-certificates-file", ep.ca_file] if ep.ca_file else [])


def admin_secret(ep: Endpoint) -> str | None:
    """The admin key that perf_analyzer's -H placeholder stands for (None: no admin header)."""
    return next(iter(ep.admin_headers.values()), None)


def input_data_file(
    ep: Endpoint, model: str, path: Path, shapes: dict | None = None, data: Path | None = None, spec=None, batch=1
) -> Path | None:
    """perf_analyzer input data for a model, from its server-side plan (clients.model_plan): the user's data
    (clients/given_data.py: one entry per row, perf_analyzer taking `batch` consecutive ones per request;
    their perf_analyzer JSON passed as it is), checked against the model first; else made-up inputs where they
    can be made up (BYTES payloads of our pipelines, integer value ranges and dynamic lengths from our spec or --shape).
    None where perf_analyzer's own random data fits (fixed-shape float inputs only). spec: the model's
    ModelSpec where the repository is ours (clients.served.Served.spec), else None.

    Raises:
        NotMeasurable: the model's inputs cannot be made up; the message names the flag that fixes it.
    """
    from tpserve.clients.given_data import given_rows
    from tpserve.clients.inputs import plan_inputs
    from tpserve.clients.model_plan import plan

    with ep.client() as client:
        model_plan = plan(client, model, ep.headers)
    rows = given_rows(data, model_plan, batch) if data is not None else None  # checked first, as Locust reads it
    if data is not None and data.suffix == ".json":
        return data
    fixed = all(t.datatype in ("FP32", "FP16") and -1 not in t.dims for t in model_plan.inputs)
    if rows is None and fixed and not shapes:
        return None
    rows = rows or [plan_inputs(model_plan, 1, shapes, spec)]
    entries = [_perf_entry(row, model_plan) for row in rows]  # one per row: perf_analyzer forms its batches
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": entries}))
    return path


def _perf_entry(arrays: dict, model_plan) -> dict:
    """One request's tensors in perf_analyzer's JSON (shapes without the batch axis where the model batches;
    BYTES as b64 of the serialized tensor: a little-endian uint32 length before each element)."""
    entry = {}
    for name, array in arrays.items():
        sample = array[0] if model_plan.batching else array
        if sample.dtype == object or sample.dtype.kind in "SU":
            items = [v if isinstance(v, bytes) else str(v).encode() for v in sample.flat]
            blob = b"".join(struct.pack("<I", len(item)) + item for item in items)
            entry[name] = {"b64": base64.b64encode(blob).decode(), "shape": list(sample.shape)}
        else:
            entry[name] = {"content": sample.reshape(-1).tolist(), "shape": list(sample.shape)}
    return entry


@dataclass(frozen=True)
class PointFailure:
    """A point that gave no measurement at all (the server refused, perf_analyzer crashed)."""

    model: str
    batch: int
    load: str
    level: str
    message: str


def parse_csv(path: Path, sweep: Sweep, batch: int, kind: str) -> list[dict]:
    """perf_analyzer's --verbose-csv output → tidy rows (latencies in ms, server breakdown in µs)."""
    with open(path, newline="") as handle:
        records = list(csv.DictReader(handle))
    if not records:
        raise MeasurementError(f"perf_analyzer wrote no measurement to {path}")
    return [_row(r, sweep, batch, kind) for r in records]


def window_spread(output: str) -> float:
    """Spread of the measurement windows perf_analyzer printed (-v): the larger of throughput and
    average latency, as (max - min) / mean in percent; 0 where fewer than two windows were printed."""
    passes = [(float(t), float(lat)) for t, lat in PASS_LINE.findall(output)][-3:]
    if len(passes) < 2:
        return 0.0
    spreads = []
    for values in zip(*passes):
        mean = sum(values) / len(values)
        spreads.append(100 * (max(values) - min(values)) / mean if mean else 0.0)
    return round(max(spreads), 1)


def attempts(sweep: Sweep) -> list[Sweep]:
    """The sweep as given, then twice the window with more trials; the last resort (ACCEPT_ANY) follows."""
    longer = replace(sweep, measurement_ms=sweep.measurement_ms * 2, max_trials=sweep.max_trials + 3)
    return [sweep, longer]


def _run(analyzer: PerfAnalyzer, args: list[str], sweep: Sweep, secret: str | None):
    timeout = 60 + sweep.measurement_ms / 1000 * sweep.max_trials * 3
    return analyzer.attempt(args, timeout, secret)


def measure_point(
    sweep: Sweep, ep: Endpoint, analyzer: PerfAnalyzer, batch: int, load: tuple[str, str], csv_path: Path
) -> list[dict]:
    """One (batch, load) point. A point that does not stabilize is retried with longer windows; if it
    still does not, its first windows are taken as they come and the row is flagged unstable with their
    spread: a busy host gives a result, not a crash.

    Raises:
        MeasurementError: perf_analyzer failed for another reason (its output's tail in the message).
    """
    for tried in attempts(sweep):
        csv_path.unlink(missing_ok=True)
        done = _run(analyzer, perf_args(tried, ep, batch, load, csv_path), tried, admin_secret(ep))
        if done.returncode == 0:
            rows = parse_csv(csv_path, tried, batch, load[0])
            return [_stamp(r, "yes", window_spread(done.stdout), tried) for r in rows]
        if not any(words in done.stdout + done.stderr for words in UNSTABLE):
            raise MeasurementError(_failure(done))
    last = replace(tried, stability_percent=ACCEPT_ANY, max_trials=3)
    done = _run(analyzer, perf_args(last, ep, batch, load, csv_path), last, admin_secret(ep))
    if done.returncode != 0:
        raise MeasurementError(_failure(done))
    spread = window_spread(done.stdout)
    step(
        f"perf: {sweep.model} batch {batch} {load[0]} {load[1]} unstable (windows spread {spread:g}%): kept and "
        f"flagged; a longer window helps (perf_analyzer --measurement-interval: --interval-ms / INTERVAL_MS)"
    )
    return [_stamp(r, "no", spread, last) for r in parse_csv(csv_path, last, batch, load[0])]


def _stamp(row: dict, stable: str, spread: float, sweep: Sweep) -> dict:
    return {**row, "stable": stable, "spread_pct": spread, "window_ms": sweep.measurement_ms}


def _tail(done) -> str:
    return "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])


RESTRICTED_HINT = (
    " (this Triton keeps its statistics API behind a key, and perf_analyzer reads it every pass: give the key in "
    "a file, --admin-key-file FILE, make: ADMIN_KEY_FILE=FILE; the server of `make serve`: leave out --url / URL=)"
)


def _failure(done) -> str:
    """perf_analyzer's failure, its reason on the first line (what the console shows): the last line of its
    output that names an error (the server's answer included), else its last line; never empty."""
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    named = [line for line in lines if any(w in line.lower() for w in ("error", "failed", "invalid", "unable"))]
    reason = (
        named
        or lines
        or ["it printed nothing; send one request with the same data (make infer) to see the server's answer"]
    )[-1]
    hint = RESTRICTED_HINT if "is restricted, expecting header" in done.stdout + done.stderr else ""
    return f"perf_analyzer failed (exit {done.returncode}): {reason[:400]}{hint}\n{_tail(done)}"


def _row(record: dict, sweep: Sweep, batch: int, kind: str) -> dict:
    level = record.get("Concurrency") or record.get("Request Rate") or 0
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
        "stable": "yes",
        "spread_pct": 0.0,
        "window_ms": sweep.measurement_ms,
        "shapes": sweep.shapes,
    }


def run_sweep(
    sweep: Sweep, ep: Endpoint, analyzer: PerfAnalyzer, work_dir: Path, failures: list[PointFailure] | None = None
) -> list[dict]:
    """Run every (batch, load) point of a sweep; one progress line per point.

    With `failures` given, a point that fails is recorded there and the sweep goes on (finished
    points are never lost); without it, the first failure raises MeasurementError.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    if sweep.protocol != ep.protocol:  # the endpoint decides what is measured: the rows say so
        sweep = replace(sweep, protocol=ep.protocol)
    rows, points = [], [(b, load) for b in sweep.batch_sizes for load in sweep.loads()]
    for i, (batch, load) in enumerate(points, start=1):
        step(f"perf [{i}/{len(points)}] {sweep.model} {ep.protocol} batch {batch} {load[0]} {load[1]}")
        csv_path = work_dir / f"{sweep.model}_{ep.protocol}_b{batch}_{load[0]}_{load[1]}.csv"
        try:
            rows += measure_point(sweep, ep, analyzer, batch, load, csv_path)
        except MeasurementError as err:
            if failures is None:
                raise
            failures.append(PointFailure(sweep.model, batch, load[0], load[1], str(err)))
            step(f"perf: {sweep.model} batch {batch} {load[0]} {load[1]} failed, going on: {str(err).splitlines()[0]}")
    return rows


def failures_table(failures: list[PointFailure]) -> str:
    """Points that gave no measurement, as a markdown table (empty string if none)."""
    if not failures:
        return ""
    lines = ["| model | batch | load | error |", "|---|---|---|---|"]
    for f in failures:
        lines.append(f"| {f.model} | {f.batch} | {f.load} {f.level} | {f.message.splitlines()[0]} |")
    return "\n".join(lines)
