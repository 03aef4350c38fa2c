"""What Envoy costs: perf_analyzer through Envoy vs straight to one replica, side by side.

Run on a cluster (`make cluster`): the direct target is replica-0; start the cluster with
REPLICAS=1 so that both targets end at the same tritonserver and the difference is Envoy's.
"""

from __future__ import annotations

import csv
from pathlib import Path

from tpserve.clients.connection import endpoint
from tpserve.common.endpoints import Endpoint
from tpserve.loadtest.perf.sweep import Sweep, run_sweep
from tpserve.loadtest.perf.tools import PerfAnalyzer


def targets(state_dir: Path, protocol: str) -> dict[str, Endpoint]:
    """'direct' (replica-0) and 'envoy' (the cluster's front) endpoints for one protocol."""
    return {"direct": endpoint(protocol, None, state_dir / "replica-0"), "envoy": endpoint(protocol, None, state_dir)}


def measure(state_dir: Path, model: str, protocols, concurrency, analyzer: PerfAnalyzer, out: Path, **sweep) -> list:
    """For each protocol, the same sweep straight to replica-0 and through Envoy; one row per point."""
    rows = []
    for protocol in protocols:
        for name, ep in targets(state_dir, protocol).items():
            points_sweep = Sweep(model, protocol=protocol, concurrency=tuple(concurrency), **sweep)
            points = run_sweep(points_sweep, ep, analyzer, out / "raw" / name)
            rows += [{**row, "target": name} for row in points]
    return rows


def compare(rows: list[dict]) -> list[dict]:
    """Per (protocol, concurrency): throughput and p50 of both targets, the ratio, Envoy's added µs at p50."""
    index = {(r["protocol"], r["level"], r["target"]): r for r in rows}
    table = []
    for protocol, level in sorted({(r["protocol"], r["level"]) for r in rows}):
        direct, envoy = index.get((protocol, level, "direct")), index.get((protocol, level, "envoy"))
        if direct and envoy:
            table.append(
                {
                    "protocol": protocol,
                    "concurrency": int(level),
                    "direct_infer_s": direct["throughput"],
                    "envoy_infer_s": envoy["throughput"],
                    "ratio": round(envoy["throughput"] / direct["throughput"], 3),
                    "direct_p50_ms": direct["p50_ms"],
                    "envoy_p50_ms": envoy["p50_ms"],
                    "added_p50_us": round((envoy["p50_ms"] - direct["p50_ms"]) * 1000),
                }
            )
    return table


def write(table: list[dict], rows: list[dict], out: Path) -> str:
    """envoy.csv (the comparison), envoy_points.csv (every perf point), envoy.md and envoy.png; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("envoy.csv", table), ("envoy_points.csv", rows)):
        with open(out / name, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(data[0]))
            writer.writeheader()
            writer.writerows(data)
    header = "| protocol | concurrency | direct infer/s | via Envoy infer/s | ratio | direct p50 ms | via Envoy p50 ms"
    lines = [header + " | added at p50 (µs) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [
        f"| {t['protocol']} | {t['concurrency']} | {t['direct_infer_s']:,.1f} | {t['envoy_infer_s']:,.1f} | "
        f"{t['ratio']:.3f} | {t['direct_p50_ms']:.3f} | {t['envoy_p50_ms']:.3f} | {t['added_p50_us']} |"
        for t in table
    ]
    text = "\n".join(lines)
    (out / "envoy.md").write_text(f"# Envoy vs direct\n\n{text}\n\n![throughput](envoy.png)\n")
    _plot(table, out / "envoy.png")
    return text


def _plot(table: list[dict], path: Path) -> Path:
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{t['protocol']} c{t['concurrency']}" for t in table]
    positions = range(len(table))
    ax.bar([p - 0.2 for p in positions], [t["direct_infer_s"] for t in table], 0.4, label="direct to the replica")
    ax.bar([p + 0.2 for p in positions], [t["envoy_infer_s"] for t in table], 0.4, label="through Envoy")
    ax.set_xticks(list(positions), labels)
    ax.set_ylabel("inferences/s")
    ax.legend()
    return save(fig, path)
