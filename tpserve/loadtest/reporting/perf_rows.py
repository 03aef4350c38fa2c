"""perf.csv: the rows of a perf_analyzer sweep, written, read back with their numbers typed, and tabled for
people (what the sweep writes and the reports read)."""

from __future__ import annotations

import csv
from pathlib import Path

COLUMNS = (
    "model",
    "protocol",
    "batch",
    "load",
    "level",
    "throughput",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "avg_ms",
    "queue_us",
    "compute_input_us",
    "compute_infer_us",
    "compute_output_us",
    "network_us",
    "stable",
    "spread_pct",
    "window_ms",
    "shapes",
)
TEXT_COLUMNS = ("model", "protocol", "load", "stable", "shapes")


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
    with open(path, newline="") as handle:
        return [_typed(r) for r in csv.DictReader(handle)]


def _typed(record: dict) -> dict:
    row = {k: v if k in TEXT_COLUMNS else (int(v) if k == "batch" else float(v)) for k, v in record.items() if v != ""}
    row.setdefault("stable", "yes")  # runs written before stability was recorded
    return row


def markdown_table(rows: list[dict]) -> str:
    """The rows as a markdown table people read."""
    shapes = any(r.get("shapes") for r in rows)  # a text workload's lengths: the table says what was sent
    head = "| model | proto | batch | load | throughput (infer/s) | p50 ms | p99 ms | queue µs | infer µs | stability |"
    lines = [head + (" requests held |" if shapes else ""), "|" + "---|" * (10 + shapes)]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['protocol']} | {r['batch']} | {r['load']} {r['level']:g} | {r['throughput']:.1f} "
            f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['queue_us']:.0f} | {r['compute_infer_us']:.0f} "
            f"| {stability(r)} |" + (f" {r.get('shapes') or '—'} |" if shapes else "")
        )
    return "\n".join(lines)


def stability(row: dict) -> str:
    """'stable', or 'unstable ±S%' with the spread of its measurement windows."""
    if row.get("stable", "yes") == "yes":
        return "stable"
    return f"unstable ±{float(row.get('spread_pct', 0)) / 2:.0f}%"
