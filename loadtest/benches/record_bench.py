"""What recording the traffic costs: perf_analyzer at one concurrency through the edge, recording off and on.

The bench starts its own servers on the repository, one at a time, on free ports, and alternates them round by
round (off, on, values, `make serve`'s default, then again) so that a host's drift falls on every setup alike:
- "edge": one replica behind Envoy, HTTP and gRPC both through it, not recording (the baseline);
- "edge, recording": the same, RECORD=1 (shapes);
- "edge, recording values": RECORD=values (each body, base64);
- "make serve default": HTTP through the edge, gRPC straight to the server (what RECORD=1 changes for gRPC).
Each figure is the median of the rounds; the ratio compares it with the baseline's median. The paired ratio
is the median over rounds of each round's figure against the baseline's in the same round: a host whose speed
drifts between rounds moves both sides of a pair alike.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from clients.connection import endpoint
from common import endpoints
from common.cli import step
from common.errors import MeasurementError
from loadtest.perf.sweep import run_sweep

BASELINE = "edge"
SETUPS = ("edge", "edge, recording", "edge, recording values", "make serve default")


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
    """ClusterSettings of one setup, on free ports."""
    from server.cluster import ClusterSettings
    from server.recording import record_settings

    http, grpc, metrics, health = endpoints.free_ports(4)
    mode = {"edge, recording": "1", "edge, recording values": "values"}.get(setup, "0")
    single = setup != BASELINE  # a cluster of one replica routes gRPC through Envoy without recording
    return ClusterSettings(
        repo,
        1,
        http,
        grpc,
        metrics,
        state_dir=state_dir,
        single=single,
        health_port=health,
        record=record_settings(mode, state_dir),
    )


def measure(repo: Path, models, setups, protocols, concurrency: int, rounds: int, out: Path, interval_ms: int):
    """Every setup, every round: start it, one perf point per model and protocol, stop it; one row per point.
    Each model is measured as `loadtest perf` measures it (text models: lognormal lengths; pipelines: images)."""
    from clients.served import served_spec
    from loadtest.perf.run import PerfRequest, model_sweep
    from loadtest.perf.tools import find_perf_analyzer
    from server.cluster import start_cluster, stop_cluster

    analyzer, rows = find_perf_analyzer(), []
    for round_ in range(1, rounds + 1):
        for setup in setups:
            state_dir = out / "state" / f"{setup.replace(' ', '_').replace(',', '')}-{round_}"
            step(f"record-bench round {round_}/{rounds}: {setup}")
            start_cluster(settings_for(setup, repo, state_dir))
            try:
                for model, protocol in [(m, p) for m in models for p in protocols]:
                    ep = endpoint(protocol, None, state_dir)
                    work = out / "raw" / state_dir.name
                    request = PerfRequest(
                        models=(model,),
                        protocol=protocol,
                        concurrency=(concurrency,),
                        interval_ms=interval_ms,
                        stability=50.0,
                        out=work,
                    )
                    sweep = model_sweep(request, ep, served_spec(repo, model), model, {})
                    found = run_sweep(sweep, ep, analyzer, work) if sweep else []
                    rows += [{**row, "setup": setup, "round": round_} for row in found]
            finally:
                stop_cluster(state_dir)
    return rows


def compare(rows: list[dict]) -> list[dict]:
    """Per (protocol, setup): median throughput and p50 over the rounds, the ratio to the baseline's median."""
    table = []
    for model, protocol in sorted({(r["model"], r["protocol"]) for r in rows}):
        medians = {}
        mine = [r for r in rows if r["protocol"] == protocol and r["model"] == model]
        base_by_round = {r.get("round"): r["throughput"] for r in mine if r["setup"] == BASELINE}
        for setup in dict.fromkeys(r["setup"] for r in rows):
            points = [r for r in mine if r["setup"] == setup]
            if points:
                medians[setup] = (
                    statistics.median(p["throughput"] for p in points),
                    statistics.median(p["p50_ms"] for p in points),
                    [round(p["throughput"]) for p in points],
                    _paired(points, base_by_round),
                )
        base = medians.get(BASELINE, (0.0,))[0]
        for setup, (throughput, p50, each, paired) in medians.items():
            ratio = round(throughput / base, 3) if base else None
            table.append(
                {
                    "model": model,
                    "protocol": protocol,
                    "setup": setup,
                    "infer_s": round(throughput, 1),
                    "ratio": ratio,
                    "paired_ratio": paired,
                    "p50_ms": p50,
                    "rounds": " ".join(f"{t:,}" for t in each),
                }
            )
    return table


def _paired(points: list[dict], base_by_round: dict):
    """The median over rounds of throughput / the baseline's throughput in the same round; None without pairs."""
    ratios = [p["throughput"] / base_by_round[p.get("round")] for p in points if base_by_round.get(p.get("round"))]
    return round(statistics.median(ratios), 3) if ratios else None


def write(table: list[dict], rows: list[dict], out: Path, header: str) -> str:
    """record.csv, record_points.csv, record.md and record.png; returns the markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("record.csv", table), ("record_points.csv", rows)):
        with open(out / name, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(data[0]))
            writer.writeheader()
            writer.writerows(data)
    lines = [
        "| model | protocol | setup | infer/s (median) | ratio to the edge | paired ratio (median of rounds) "
        "| p50 ms | each round (infer/s) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {t['model']} | {t['protocol']} | {t['setup']} | {t['infer_s']:,.1f} | "
        f"{t['ratio'] if t['ratio'] is not None else '—'} | "
        f"{t['paired_ratio'] if t['paired_ratio'] is not None else '—'} | {t['p50_ms']:.3f} | {t['rounds']} |"
        for t in table
    ]
    text = "\n".join(lines)
    (out / "record.md").write_text(
        f"# What recording the traffic costs\n\n{header}\n\n{text}\n\n![throughput](record.png)\n"
    )
    _plot(table, out / "record.png")
    return text


def _plot(table: list[dict], path: Path) -> Path:
    from loadtest.reporting.plots import pyplot, save

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
