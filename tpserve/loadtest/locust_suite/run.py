"""Run Locust headless against the server (locally or with worker processes) and read its CSV."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.reporting.server_view import record_window

LOCUSTFILE = Path(__file__).with_name("locustfiles") / "models.py"
SLO_EXIT = 3
HUNG = -1000  # _run_to_end's answer for a Locust that did not exit STOP_GRACE_S after a SIGTERM (it was killed)
HEADERS_FILE = ".headers.json"


@dataclass(frozen=True, kw_only=True)
class LocustRun:
    """One headless Locust run."""

    models: tuple[tuple[str, int], ...]  # (model, weight); empty: every ready model of the server (load_test)
    protocol: str = "grpc"
    users: int = 4
    spawn_rate: float = 4
    run_time_s: int = 10
    processes: int = 0
    rate_per_user: float = 0.0
    shape: str = "constant"
    slo_p99_ms: float = 0.0
    slo_fail_ratio: float = -1.0
    batch: int = 1
    shapes: dict = field(default_factory=dict)  # dynamic dims per input (--shape)
    input_data: str = ""  # the user's data: .npz or perf_analyzer JSON
    lengths: str = "lognormal"  # token and text models: sentence lengths per request (loadtest/workloads/text.py)
    headers: dict = field(default_factory=dict)  # sent with every request; passed through a 0600 file
    tls: bool = False
    ca_file: str = ""

    def __post_init__(self):
        if self.shape not in ("constant", "step", "burst"):
            raise MeasurementError(f"shape {self.shape!r} unknown; expected 'constant', 'step' or 'burst'")
        if self.users < 1 or self.run_time_s < 1:
            raise MeasurementError(
                f"a Locust run needs at least one user and one second, got {self.users} and {self.run_time_s}"
            )


class Reachable(Protocol):
    """What Locust needs of a server: its URLs and, where it is ours, its repository (a Target or a ServerState)."""

    @property
    def http_url(self) -> str: ...

    @property
    def grpc_url(self) -> str: ...

    @property
    def repo(self) -> str | Path | None: ...


@dataclass(frozen=True, kw_only=True)
class LocustResult:
    """One Locust run: its per-endpoint rows (read_stats: name, requests, failures, percentiles), whether the SLO
    watchdog let it finish, Locust's exit code (1: some requests failed) and its log."""

    rows: list[dict]
    slo_ok: bool
    exit_code: int
    log: Path

    def row(self, name: str = "Aggregated") -> dict:
        """The row of one endpoint (by default the total); KeyError if Locust wrote none."""
        found = next((r for r in self.rows if r["name"] == name), None)
        if found is None:
            raise KeyError(f"no Locust row named {name!r}: {[r['name'] for r in self.rows]}")
        return found


@dataclass(frozen=True)
class Target:
    """Where Locust sends requests: any server (a ServerState of ours has the same fields)."""

    http_url: str
    grpc_url: str
    repo: Path | None = None

    @classmethod
    def of(cls, ep) -> "Target":
        """The target of an Endpoint (its URL serves its protocol)."""
        return cls(ep.url, ep.url, ep.repo)


STOP_TIMEOUT_S = 10
STOP_GRACE_S = STOP_TIMEOUT_S + 30  # from a SIGTERM passed on to Locust to its exit, at most (then it is killed)


def locust_command(run: LocustRun, prefix: Path) -> list[str]:
    """The headless locust command line (CSV and HTML written under prefix)."""
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--csv",
        str(prefix),
        "--html",
        f"{prefix}.html",
        "--only-summary",
        "--exit-code-on-error",
        "1",
        "--stop-timeout",  # users finish the request in flight: a gRPC call cancelled as it completes can crash
        str(STOP_TIMEOUT_S),  # tritonserver 2.51 (triton-inference-server/server#8034, fixed in later releases)
    ]
    if run.shape == "constant":
        command += ["-u", str(run.users), "-r", f"{run.spawn_rate:g}", "-t", f"{run.run_time_s}s"]
    if run.processes:
        command += ["--processes", str(run.processes)]
    return command


def locust_environment(run: LocustRun, state: Reachable) -> dict:
    """Environment variables the locustfile, the watchdog and the step shape read."""
    env = dict(os.environ)
    env.update(
        TRITON_MODELS=" ".join(f"{m}:{w}" for m, w in run.models),
        TRITON_PROTOCOL=run.protocol,
        TRITON_HTTP_URL=state.http_url,
        TRITON_GRPC_URL=state.grpc_url,
        TRITON_BATCH=str(run.batch),
        TRITON_RATE_PER_USER=f"{run.rate_per_user:g}",
        TRITON_REPO=str(state.repo or ""),
        TRITON_SHAPES=json.dumps(run.shapes),
        TRITON_INPUT_DATA=run.input_data,
        TRITON_LENGTHS=run.lengths,
        TRITON_TLS="1" if run.tls else "",
        TRITON_CA_FILE=run.ca_file,
        SLO_P99_MS=f"{run.slo_p99_ms:g}",
        SLO_FAIL_RATIO=f"{run.slo_fail_ratio:g}",
        LOAD_SHAPE=run.shape,
        STEP_MAX_USERS=str(run.users),
        STEP_TOTAL_SECONDS=str(run.run_time_s),
    )
    return env


def run_locust(run: LocustRun, state: Reachable, out_dir: Path) -> LocustResult:
    """Run Locust against state (a Target, or a ServerState of ours); what it measured.

    Raises:
        MeasurementError: Locust failed for another reason than the SLO watchdog.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix, log = out_dir / "locust", out_dir / "locust.log"
    env = locust_environment(run, state)
    pass_headers(env, run.headers, out_dir)
    workers = f", {run.processes} worker processes" if run.processes else ""
    step(f"locust: {run.users} users, {run.run_time_s} s, {run.protocol}{workers}, models {dict(run.models)}")
    started = time.time()
    with open(log, "w") as handle:
        try:
            code = _run_to_end(locust_command(run, prefix), env, handle, run.run_time_s + 120)
        except subprocess.TimeoutExpired as err:
            raise MeasurementError(f"locust ran past {run.run_time_s + 120} s; its log ends:\n{log_tail(log)}") from err
        finally:
            forget_headers(out_dir)
    ended = time.time()
    record_window(out_dir, started, ended)
    if ended - started < run.run_time_s - 1:
        step(f"locust: stopped after {ended - started:.0f} s of {run.run_time_s} s (SIGTERM); the report covers that")
    rows = read_stats(Path(f"{prefix}_stats.csv"))
    if code == HUNG:
        code = 1 if any(r["failures"] for r in rows) else 0
        step(
            f"locust: did not exit {STOP_GRACE_S} s after it was stopped, so it was killed; its statistics (written "
            "each second) are read, and its exit code is taken from their failures"
        )
    if code in (0, 1, SLO_EXIT) and not rows:
        raise MeasurementError(
            f"locust completed no request in {ended - started:.0f} s (a slow start, or a run stopped early); its "
            f"log ({log}) ends:\n{log_tail(log)}"
        )
    if code not in (0, 1, SLO_EXIT):
        raise MeasurementError(f"locust failed (exit {code}); its log ({log}) ends:\n{log_tail(log)}")
    history_plot(Path(f"{prefix}_stats_history.csv"), out_dir / "locust_history.png")
    return LocustResult(rows=rows, slo_ok=code != SLO_EXIT, exit_code=code, log=log)


def _run_to_end(command: list[str], env: dict, handle, timeout: float, grace: float = STOP_GRACE_S) -> int:
    """Locust's exit code. A SIGTERM to this process is passed on to Locust, which stops its users and still
    writes its statistics: a run stopped early (a load held while something else happens) keeps its report.
    A Locust that has not exited `grace` seconds after that is killed, and HUNG comes back.

    Raises:
        subprocess.TimeoutExpired: Locust ran past timeout (it is killed).
    """
    process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    asked: list[float] = []  # when a SIGTERM was passed on

    def stop(*_):
        asked.append(time.monotonic())
        process.send_signal(signal.SIGTERM)

    forwarding = threading.current_thread() is threading.main_thread()
    if forwarding:
        before = signal.signal(signal.SIGTERM, stop)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return process.wait(0.5)
            except subprocess.TimeoutExpired:
                if asked and time.monotonic() - asked[0] > grace:
                    _kill(process)
                    return HUNG
                if time.monotonic() > deadline:
                    _kill(process)
                    raise
    finally:
        if forwarding:
            signal.signal(signal.SIGTERM, before)


def _kill(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def pass_headers(env: dict, headers: dict, out_dir: Path) -> None:
    """Headers for the locustfile (TRITON_HEADERS_FILE): they may carry a secret, so a file only the owner reads,
    not the environment; forget_headers removes it after the run."""
    if headers:
        path = out_dir / HEADERS_FILE
        path.touch(mode=0o600)
        path.write_text(json.dumps(headers))
        env["TRITON_HEADERS_FILE"] = str(path)


def forget_headers(out_dir: Path) -> None:
    (out_dir / HEADERS_FILE).unlink(missing_ok=True)  # the report folder keeps no secret


def log_tail(log: Path, lines: int = 6) -> str:
    return "\n".join(log.read_text(errors="replace").strip().splitlines()[-lines:])


def read_history(path: Path) -> list[dict]:
    """Locust's <prefix>_stats_history.csv, the 'Aggregated' rows: seconds since start, users, requests/s,
    failures/s and p50/p95/p99 in ms (NaN before the first response)."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        rows = csv.DictReader(handle)  # a row cut short (a run stopped while writing) is left out
        records = [r for r in rows if r.get("Name") == "Aggregated" and str(r.get("Timestamp", "")).isdigit()]
    if not records:
        return []
    start = int(records[0]["Timestamp"])
    number = lambda r, k: float(r[k]) if r.get(k) not in (None, "", "N/A") else float("nan")  # noqa: E731
    return [
        {
            "t": int(r["Timestamp"]) - start,
            "users": number(r, "User Count"),
            "rps": number(r, "Requests/s"),
            "fails": number(r, "Failures/s"),
            "p50": number(r, "50%"),
            "p95": number(r, "95%"),
            "p99": number(r, "99%"),
        }
        for r in records
    ]


def history_plot(history_csv: Path, path: Path) -> Path | None:
    """PNG: p50/p95/p99 (ms) and requests/s over the run, from Locust's stats history (None: no history)."""
    from tpserve.loadtest.reporting.plots import pyplot, save

    points = read_history(history_csv)
    if len(points) < 2:
        return None
    plt = pyplot()
    fig, (lat, rate) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    t = [p["t"] for p in points]
    for key in ("p50", "p95", "p99"):
        lat.plot(t, [p[key] for p in points], label=key)
    lat.set_ylabel("latency (ms)")
    lat.legend(fontsize=8)
    rate.plot(t, [p["rps"] for p in points], label="requests/s")
    rate.plot(t, [p["fails"] for p in points], label="failures/s", color="tab:red")
    rate.set_xlabel("seconds since start")
    rate.set_ylabel("per second")
    rate.legend(fontsize=8)
    for ax in (lat, rate):
        ax.grid(alpha=0.3)
    lat.set_title("Locust: latency percentiles and request rate over the run")
    return save(fig, path)


def read_stats(path: Path) -> list[dict]:
    """Locust's <prefix>_stats.csv → rows with throughput, failures and percentiles (ms)."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return [_row(r) for r in csv.DictReader(handle) if r.get("Request Count", "0") != "0"]


def _row(record: dict) -> dict:
    number = lambda key: float(record[key]) if record.get(key) not in (None, "", "N/A") else float("nan")  # noqa: E731
    return {
        "name": record["Name"],
        "type": record["Type"],
        "requests": int(record["Request Count"]),
        "failures": int(record["Failure Count"]),
        "throughput": number("Requests/s"),
        "p50_ms": number("50%"),
        "p90_ms": number("90%"),
        "p95_ms": number("95%"),
        "p99_ms": number("99%"),
        "avg_ms": number("Average Response Time"),
    }


def markdown_table(rows: list[dict]) -> str:
    """Locust rows as a markdown table."""
    lines = ["| request | type | requests | failures | req/s | p50 ms | p95 ms | p99 ms |", "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['type']} | {r['requests']} | {r['failures']} | {r['throughput']:.1f} "
            f"| {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def weighted(models: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """'model[:weight]' -> (model, weight) (weight 1 if none)."""
    found = []
    for text in models:
        name, _, weight = text.partition(":")
        if weight and not weight.isdigit():
            raise MeasurementError(f"{text!r}: a model's weight is a whole number ('{name}:2')")
        found.append((name, int(weight or 1)))
    return tuple(found)


def unmeasurable(ep, run: LocustRun, served) -> dict[str, str]:
    """Models Locust cannot drive, with why and the flag that fixes it (the rest run); served:
    clients.served.Served (the specs where the repository is ours)."""
    from tpserve.clients.given_data import given_rows
    from tpserve.clients.inputs import plan_inputs
    from tpserve.clients.model_plan import NotMeasurable, plan

    skipped = {}
    with ep.client() as client:
        for model, _ in run.models:
            described = plan(client, model, ep.headers)
            try:
                described.require_protocol(ep.protocol)
                if run.input_data:  # checked before any user starts, as perf_analyzer reads it
                    given_rows(Path(run.input_data), described, run.batch)
                else:
                    plan_inputs(described, run.batch, run.shapes, served.spec(model))
            except NotMeasurable as err:
                skipped[model] = str(err).removeprefix(f"{model}: ")
                step(f"not load-tested: {err}")
    return skipped


def load_test(ep, run: LocustRun, out: Path) -> tuple[str, Path, LocustResult]:
    """Locust against ep on run.models (none: the served repository's ready models), those it cannot drive left
    out with why; writes locust.md, skipped.json, the context and the report. Returns (table, report, result)."""
    import dataclasses

    from tpserve.clients.served import require_ready
    from tpserve.loadtest.perf.run import served_or_given, write_skipped
    from tpserve.loadtest.reporting.report import build_report, write_context

    served = served_or_given(tuple(m for m, _ in run.models), ep)
    models = run.models or weighted(served.names)
    require_ready(ep, [m for m, _ in models])  # a typo fails here in a second, not in Locust's log
    out.mkdir(parents=True, exist_ok=True)
    skipped = unmeasurable(ep, dataclasses.replace(run, models=models), served)
    models = tuple((m, w) for m, w in models if m not in skipped)
    write_skipped(out, served, skipped)
    if not models:
        raise MeasurementError(f"no model can be load-tested: {skipped}")
    result = run_locust(dataclasses.replace(run, models=models), Target.of(ep), out)
    table = markdown_table(result.rows)
    (out / "locust.md").write_text(f"# Locust run\n\n{table}\n")
    write_context(out, ep, [m for m, _ in models])
    return table, build_report(out, ep.repo), result
