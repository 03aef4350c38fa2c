"""What recording the traffic costs: perf_analyzer at one concurrency through the edge, recording off and on.

The bench starts its own servers on the repository, one at a time, on free ports, and alternates them round by
round (off, on, values, `make serve`'s default, then again) so that a host's drift falls on every setup alike:
- "edge": one replica behind Envoy, HTTP and gRPC both through it, not recording (the baseline);
- "edge, recording": the same, RECORD=1 (shapes);
- "edge, recording values": RECORD=values (each body, base64);
- "make serve default": `make serve` as it starts (HTTP and gRPC through the edge, not recording);
- "edge, again": a second edge exactly like the baseline (the control): what two identical setups differ by
  on this host, the noise any other setup's ratio carries.
The setups run in one order in odd rounds and in the reverse order in even ones, so that no setup always
follows the same one. Each figure is the median of the rounds; the ratio compares it with the baseline's
median. The paired ratio is each round's figure against the baseline's in the same round (a host whose speed
drifts between rounds moves both sides of a pair alike): its mean over the rounds, with a 95% bootstrap
interval, and the verdict on the 5% floor that the interval allows (shown, missed, or not resolved).
CPU a request: over each point, Envoy's own CPU time (its process) and the host's busy time (all processes,
perf_analyzer included; stolen time not), divided by the requests the server counted. At concurrency 4 a small
model keeps a 2-core host busy, so throughput follows the host's CPU a request; Envoy's figure moves far less
from round to round than throughput does, which makes the recording's own cost readable where throughput
ratios are not.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from pathlib import Path

from tpserve.clients.connection import endpoint
from tpserve.common import endpoints
from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.perf.sweep import run_sweep

BASELINE = "edge"
CONTROL = "edge, again"
SETUPS = (
    BASELINE,
    "edge, recording",
    "edge, recording values",
    "make serve default",
    CONTROL,
)
FLOOR = 0.95  # the floor: recording costs at most 5% of throughput


def chosen_setups(numbers: str | None) -> tuple[str, ...]:
    """--setups "1 2": those SETUPS by number (1-based), the baseline always among them; None: all.

    Raises:
        MeasurementError: a number that names no setup.
    """
    if not numbers:
        return SETUPS
    picked = set()
    for word in numbers.replace(",", " ").split():
        if not word.isdigit() or not 1 <= int(word) <= len(SETUPS):
            named = "; ".join(f"{i} {name}" for i, name in enumerate(SETUPS, 1))
            raise MeasurementError(f"--setups {numbers!r}: use the setups' numbers ({named})")
        picked.add(SETUPS[int(word) - 1])
    picked.add(BASELINE)
    return tuple(s for s in SETUPS if s in picked)


def settings_for(setup: str, repo: Path, state_dir: Path):
    """The stack of one setup, on free ports: one server behind the edge, or (baseline, control) a cluster of
    one replica, which routes gRPC through Envoy without recording."""
    from tpserve.server.cluster import ClusterSettings
    from tpserve.server.edge.recording import record_settings
    from tpserve.server.single import SingleSettings

    http, grpc, metrics, health = endpoints.free_ports(4)
    mode = {"edge, recording": "1", "edge, recording values": "values"}
    record = record_settings(mode.get(setup, "0"), state_dir)
    if setup in (BASELINE, CONTROL):
        return ClusterSettings(
            repo, replicas=1, http_port=http, grpc_port=grpc, admin_port=metrics, state_dir=state_dir, record=record
        )
    return SingleSettings(
        repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        health_port=health,
        state_dir=state_dir,
        record=record,
    )


def measure(
    repo: Path,
    models,
    setups,
    protocols,
    concurrency: int,
    rounds: int,
    out: Path,
    interval_ms: int,
    together=False,
):
    """Every setup, every round: one perf point per model and protocol; one row per point. Each model is measured
    as `loadtest perf` measures it (text models: lognormal lengths; pipelines: images).
    together=False: each setup is started for its points and stopped after them, round by round. together=True:
    every setup's server is started once, before the first round, and they all stay up while the points alternate
    among them (an idle server costs the host next to nothing): no restart between the points compared, and a
    round takes seconds, not a minute, so the host's drift falls within a pair."""
    from tpserve.server.stack import start_stack, stop_stack

    state = {setup: out / "state" / _folder(setup) for setup in setups}
    rows: list[dict] = []
    started: list[Path] = []
    try:
        if together:
            for setup in setups:
                step(f"record-bench: starting {setup}")
                start_stack(settings_for(setup, repo, state[setup]))
                started.append(state[setup])
        for round_ in range(1, rounds + 1):
            for setup in in_order(setups, round_):
                step(f"record-bench round {round_}/{rounds}: {setup}")
                state_dir = state[setup] if together else state[setup].with_name(f"{state[setup].name}-{round_}")
                if not together:
                    start_stack(settings_for(setup, repo, state_dir))
                    started.append(state_dir)
                points = _points_again_once(
                    repo,
                    models,
                    protocols,
                    concurrency,
                    interval_ms,
                    state_dir,
                    out / "raw" / f"{state_dir.name}-r{round_}",
                )
                rows += [{**row, "setup": setup, "round": round_} for row in points]
                save_points(rows, out)
                if not together:
                    stop_stack(started.pop())
    finally:
        for state_dir in reversed(started):
            stop_stack(state_dir)
    return rows


def _folder(setup: str) -> str:
    return setup.replace(" ", "_").replace(",", "")


def save_points(rows: list[dict], out: Path) -> None:
    """record_points.csv with every point so far, rewritten after each one: a run cut short keeps its points,
    and record-bench-report reads them."""
    if not rows:
        return
    out.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(key for row in rows for key in row))
    partial = out / "record_points.csv.partial"
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(out / "record_points.csv")


def in_order(setups, round_: int) -> list:
    """The setups of one round: as given in odd rounds, reversed in even ones (ABC, CBA, ABC...)."""
    return list(setups) if round_ % 2 else list(reversed(setups))


def read_points(paths) -> list[dict]:
    """The points of one or more runs' record_points.csv, their rounds numbered on from run to run (pooled:
    a pair stays within its run and round).

    Raises:
        MeasurementError: a file that is not a run's points.
    """
    rows: list[dict] = []
    offset = 0
    for path in paths:
        try:
            with open(path, newline="") as handle:
                found = list(csv.DictReader(handle))
        except OSError as err:
            raise MeasurementError(f"{path}: cannot read the points ({err.strerror})") from None
        if not found or not {"setup", "round", "throughput", "protocol", "model", "p50_ms"} <= set(found[0]):
            raise MeasurementError(f"{path}: not a record-bench run's record_points.csv")
        blocks = max((r["block"] for r in rows if r.get("block") is not None), default=0)
        for row in found:
            read = {**{k: _number(v) for k, v in row.items()}, "round": offset + int(row["round"])}
            if read.get("block") is not None:  # blocks too are numbered on: a block stays within its run
                read["block"] = blocks + int(read["block"])
            rows.append(read)
        offset = max(r["round"] for r in rows)
    return rows


def _number(text: str):
    if text in ("", "None"):
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _points(repo: Path, models, protocols, concurrency: int, interval_ms: int, state_dir: Path, work: Path):
    """One perf point per model and protocol against the server of state_dir, with its CPU a request."""
    from tpserve.clients.served import served_spec
    from tpserve.loadtest.perf.run import PerfRequest, model_sweep
    from tpserve.loadtest.perf.tools import find_perf_analyzer

    analyzer, rows = find_perf_analyzer(), []
    for model, protocol in [(m, p) for m in models for p in protocols]:
        ep = endpoint(protocol, None, state_dir)
        request = PerfRequest(
            models=(model,),
            protocol=protocol,
            concurrency=(concurrency,),
            interval_ms=interval_ms,
            stability=50.0,
            out=work,
        )
        sweep = model_sweep(request, ep, served_spec(repo, model), model, {})
        before = _cpu_reading(ep, model, state_dir)
        found = run_sweep(sweep, ep, analyzer, work) if sweep else []
        cpu = _cpu_per_request(before, _cpu_reading(ep, model, state_dir))
        rows += [{**row, **cpu} for row in found]
    return rows


def _points_again_once(repo, models, protocols, concurrency, interval_ms, state_dir: Path, work: Path) -> list:
    """_points, measured once more where perf_analyzer failed: on two saturated cores an edge's health check can
    miss its 1 s deadline, and for the half second until the next one the edge has no healthy upstream (run 6
    lost its last 59 rounds to one such moment at round 91). The same for every setup, so a point measured again
    favours none; its rows say `again`. A second failure ends the run."""
    from tpserve.server.edge.front import admin_socket, await_routable

    try:
        return _points(repo, models, protocols, concurrency, interval_ms, state_dir, work)
    except MeasurementError as err:
        last = [line.strip() for line in str(err).splitlines() if line.strip()][-1:]
        step(f"record-bench: the point failed ({''.join(last)}); measuring it again")
    await_routable(admin_socket(state_dir), 1, 60)
    rows = _points(repo, models, protocols, concurrency, interval_ms, state_dir, work.with_name(f"{work.name}-again"))
    return [{**row, "again": 1} for row in rows]


def _cpu_reading(ep, model: str, state_dir: Path) -> tuple:
    """(Envoy's CPU seconds, the host's busy seconds, requests the server has answered for model, the model's
    executions) now."""
    from tpserve.clients.admin import inference_statistics

    with ep.client() as client:
        stats = inference_statistics(ep, client, model)
    served = sum(int(m.get("inference_stats", {}).get("success", {}).get("count", 0)) for m in stats)
    executions = sum(int(m.get("execution_count", 0)) for m in stats)
    return _process_seconds(_envoy_pid(state_dir)), _host_busy_seconds(), served, executions, _server_seconds()


def _cpu_per_request(before: tuple, after: tuple) -> dict:
    """µs of Envoy's CPU, the servers' (tritonserver and its Python-backend stubs) and the host's a request
    between two readings (None where unreadable), and the mean batch the server ran (requests / executions): a
    slower path can change how requests meet in the batcher."""
    requests = after[2] - before[2]
    if requests <= 0:
        return {"envoy_cpu_us": None, "server_cpu_us": None, "host_cpu_us": None, "mean_batch": None}
    envoy = (after[0] - before[0]) / requests * 1e6 if before[0] is not None and after[0] is not None else None
    executions = after[3] - before[3]
    batch = round(requests / executions, 2) if executions > 0 else None
    server = (after[4] - before[4]) / requests * 1e6 if len(before) > 4 and len(after) > 4 else None
    host = (after[1] - before[1]) / requests * 1e6
    return {"envoy_cpu_us": envoy, "server_cpu_us": server, "host_cpu_us": host, "mean_batch": batch}


SERVER_COMMANDS = ("tritonserver", "triton_python_b")  # /proc/<pid>/comm: 15 characters of the stub's name


def _server_seconds() -> float:
    """User + system CPU seconds of every tritonserver and Python-backend stub process now (the idle ones of
    other setups add next to nothing)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        try:
            ours = entry.name.isdigit() and (entry / "comm").read_text().startswith(SERVER_COMMANDS)
        except OSError:  # gone meanwhile
            continue
        total += (_process_seconds(int(entry.name)) or 0.0) if ours else 0.0
    return total


def _envoy_pid(state_dir: Path) -> int | None:
    """Envoy's pid: the child of its keeper (cluster.json's envoy_pid)."""
    from tpserve.server.stack import read_stack

    keeper = read_stack(state_dir).envoy_pid
    try:
        children = Path(f"/proc/{keeper}/task/{keeper}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if keeper and children else None


def _process_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (None: gone or unknown)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _host_busy_seconds() -> float:
    """The host's CPU seconds not idle, not waiting on I/O and not stolen, all cores together."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle, iowait, steal = fields[3], fields[4], fields[7] if len(fields) > 7 else 0
    return (sum(fields[:8]) - idle - iowait - steal) / os.sysconf("SC_CLK_TCK")


def _median_of(points: list[dict], key: str):
    values = [p[key] for p in points if p.get(key) is not None]
    return round(statistics.median(values), 1) if values else None


def compare(rows: list[dict]) -> list[dict]:
    """Per (protocol, setup): median throughput and p50 over the rounds, the ratio to the baseline's median."""
    table = []
    for model, protocol in sorted({(r["model"], r["protocol"]) for r in rows}):
        medians = {}
        mine = [r for r in rows if r["protocol"] == protocol and r["model"] == model]
        base_by_round = {r.get("round"): r["throughput"] for r in mine if r["setup"] == BASELINE}
        control_by_round = {r.get("round"): r["throughput"] for r in mine if r["setup"] == CONTROL}
        both_by_round = {  # the two plain edges of a round together: their geometric mean
            k: math.sqrt(v * control_by_round[k]) for k, v in base_by_round.items() if control_by_round.get(k)
        }
        for setup in dict.fromkeys(r["setup"] for r in rows):
            points = [r for r in mine if r["setup"] == setup]
            if points:
                medians[setup] = (
                    statistics.median(p["throughput"] for p in points),
                    statistics.median(p["p50_ms"] for p in points),
                    [round(p["throughput"]) for p in points],
                    _paired(points, base_by_round),
                    _paired(points, {} if setup in (BASELINE, CONTROL) else control_by_round),
                    _paired(points, {} if setup in (BASELINE, CONTROL) else both_by_round),
                    _median_of(points, "envoy_cpu_us"),
                    _median_of(points, "server_cpu_us"),
                    _median_of(points, "host_cpu_us"),
                    _median_of(points, "mean_batch"),
                )
        base = medians.get(BASELINE, (0.0,))[0]
        for setup, (
            throughput,
            p50,
            each,
            paired,
            to_control,
            to_both,
            envoy_us,
            server_us,
            host_us,
            batch,
        ) in medians.items():
            ratio = round(throughput / base, 3) if base else None
            table.append(
                {
                    "model": model,
                    "protocol": protocol,
                    "setup": setup,
                    "infer_s": round(throughput, 1),
                    "ratio": ratio,
                    **paired,
                    "verdict": None if setup == BASELINE else paired["verdict"],
                    **{f"control_{k}": v for k, v in to_control.items()},
                    **{f"both_{k}": v for k, v in to_both.items()},
                    "envoy_cpu_us": envoy_us,
                    "server_cpu_us": server_us,
                    "host_cpu_us": host_us,
                    "mean_batch": batch,
                    "p50_ms": p50,
                    "rounds": " ".join(f"{t:,}" for t in each),
                }
            )
    return table


def _paired(points: list[dict], base_by_round: dict) -> dict:
    """Each round's throughput / the baseline's in the same round: their geometric mean, its 95% bootstrap
    interval and what that interval says of the floor (all None without pairs)."""
    paired = [p for p in points if base_by_round.get(p.get("round"))]
    ratios = [p["throughput"] / base_by_round[p.get("round")] for p in paired]
    if not ratios:
        return {"paired_ratio": None, "paired_low": None, "paired_high": None, "verdict": None}
    blocks = [p.get("block") for p in paired]
    low, high = bootstrap_interval(ratios, blocks if None not in blocks else None)
    return {
        "paired_ratio": round(_geometric_mean(ratios), 3),
        "paired_low": round(low, 3),
        "paired_high": round(high, 3),
        "verdict": verdict(low, high, len(ratios)),
    }


def _geometric_mean(values) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def bootstrap_interval(
    ratios: list[float], blocks: list | None = None, level: float = 0.95, resamples: int = 4000
) -> tuple[float, float]:
    """The interval that holds the geometric mean of ratios at this level, by resampling the rounds (a fixed
    seed: the same rounds give the same interval). blocks (one a ratio, from runs that started new Envoys every
    few rounds): whole blocks are resampled, each with all its rounds, since a block's rounds share their Envoys'
    speed."""
    import random

    draw = random.Random(0)
    groups: dict = {}
    for ratio, block in zip(ratios, blocks or range(len(ratios))):
        groups.setdefault(block, []).append(ratio)
    units = list(groups.values())
    means = sorted(
        _geometric_mean([r for unit in draw.choices(units, k=len(units)) for r in unit]) for _ in range(resamples)
    )
    cut = int(resamples * (1 - level) / 2)
    return means[cut], means[-cut - 1]


def verdict(low: float, high: float, rounds: int) -> str:
    """What a paired interval says of the floor (at most 5% less throughput than the edge)."""
    if rounds < 5:
        return f"not resolved ({rounds} rounds: run at least 5)"
    if low >= FLOOR:
        return "within 5%: shown"
    if high < FLOOR:
        return "over 5%: shown"
    return "not resolved"


def write(table: list[dict], rows: list[dict], out: Path, header: str) -> str:
    """record.csv, record_points.csv, record.md and record.png; returns the markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "record.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    save_points(rows, out)
    lines = [
        "| model | protocol | setup | infer/s (median) | ratio to the edge | paired ratio (mean of rounds) "
        "| its 95% interval | the 5% floor | paired ratio to the control (95% interval): the 5% floor "
        "| paired ratio to both plain edges (95% interval): the 5% floor "
        "| Envoy CPU µs a request | server CPU µs a request | host CPU µs a request | mean batch | p50 ms "
        "| each round (infer/s) |",
        "|---|---|---|---:|---:|---:|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {t['model']} | {t['protocol']} | {t['setup']} | {t['infer_s']:,.1f} | "
        f"{t['ratio'] if t['ratio'] is not None else '—'} | {_or_dash(t['paired_ratio'])} | "
        f"{_interval(t)} | {t.get('verdict') or '—'} | {_against(t, 'control')} | {_against(t, 'both')} | "
        f"{_or_dash(t['envoy_cpu_us'])} | {_or_dash(t.get('server_cpu_us'))} | {_or_dash(t['host_cpu_us'])} | "
        f"{_or_dash(t.get('mean_batch'))} | "
        f"{t['p50_ms']:.3f} | {t['rounds']} |"
        for t in table
    ]
    text = "\n".join(lines)
    notes = (
        "Paired ratio: each round's throughput over the edge's in the same round, the geometric mean over the "
        "rounds; its interval comes from resampling the rounds (95%). The 5% floor is shown met where the whole "
        "interval lies at or above 0.95, shown missed where it lies below, and not resolved where it holds 0.95. "
        f"'{CONTROL}' is a second edge like the first: its interval is what this host's noise alone gives. Both "
        "plain edges: each round's throughput over the geometric mean of the edge's and the control's in that round. "
        "Envoy CPU: its process over each point, per request the server answered. Server CPU: tritonserver and "
        "its Python-backend stubs. Host CPU: every process, perf_analyzer included."
    )
    (out / "record.md").write_text(
        f"# What recording the traffic costs\n\n{header}\n\n{text}\n\n{notes}\n\n![throughput](record.png)\n"
    )
    _plot(table, out / "record.png")
    return text


def _interval(row: dict) -> str:
    low, high = row.get("paired_low"), row.get("paired_high")
    return "—" if low is None or row.get("setup") == BASELINE else f"{low:.3f}-{high:.3f}"


def _against(row: dict, which: str) -> str:
    """A setup's paired ratio against the control ('control') or both plain edges ('both'), with its interval."""
    if row.get(f"{which}_paired_ratio") is None:
        return "—"
    return (
        f"{row[f'{which}_paired_ratio']} ({row[f'{which}_paired_low']:.3f}-{row[f'{which}_paired_high']:.3f}): "
        f"{row[f'{which}_verdict']}"
    )


def _or_dash(value) -> str:
    return "—" if value is None else f"{value:,}"


def _plot(table: list[dict], path: Path) -> Path:
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    protocols = sorted({(t["model"], t["protocol"]) for t in table})
    setups = list(dict.fromkeys(t["setup"] for t in table))
    width = 0.8 / max(1, len(setups))
    for i, setup in enumerate(setups):
        values = [
            next((t["ratio"] or 0 for t in table if (t["model"], t["protocol"]) == p and t["setup"] == setup), 0)
            for p in protocols
        ]
        ax.bar([x + i * width for x in range(len(protocols))], values, width, label=setup)
    ax.set_xticks(
        [x + width * (len(setups) - 1) / 2 for x in range(len(protocols))], [f"{m}\n{p}" for m, p in protocols]
    )
    ax.axhline(0.95, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("throughput / the edge's (medians of the rounds)")
    ax.legend(fontsize=8)
    return save(fig, path)
