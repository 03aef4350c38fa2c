"""The server-side view of a run from Prometheus: what Triton itself counted during the run's window.

perf and Locust runs write window.json (start, end); `python -m tpserve.loadtest report RUN --prometheus URL`
(or the Prometheus of STATE_DIR, `make monitor`) adds a section with, per model, the requests
Triton served, its throughput and queue time per request over time (server_view.csv, .png).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from tpserve.loadtest.monitoring import prometheus_server as prom
from tpserve.loadtest.monitoring.prometheus_rules import inferences_per_s, queue_time_per_request, requests_per_s

WINDOW = "window.json"


def record_window(run: Path, start: float, end: float) -> None:
    """Write the run's time window (epoch seconds) for the server-side view."""
    run.mkdir(parents=True, exist_ok=True)
    (run / WINDOW).write_text(json.dumps({"start": round(start, 3), "end": round(end, 3)}))


def series(window: str) -> dict[str, str]:
    """Name -> PromQL of each series of the view (rates over `window`)."""
    return {
        "inferences_per_s": inferences_per_s(window),
        "requests_per_s": requests_per_s(window),
        "queue_us_per_request": queue_time_per_request(window),
    }


def collect(url: str, start: float, end: float) -> list[dict]:
    """Rows (series, model, t_s, value) over [start, end], one step per ~1/60 of it (at least 1 s)."""
    step = max(1.0, (end - start) / 60)
    window = f"{max(5, int(step * 4))}s"
    rows = []
    for name, expr in series(window).items():
        for result in prom.query_range(url, expr, start, end + step, step):
            model = result["metric"].get("model", "")
            rows += [
                {"series": name, "model": model, "t_s": round(float(t) - start, 1), "value": float(v)}
                for t, v in result["values"]
                if v not in ("NaN", "+Inf", "-Inf")
            ]
    return rows


def served_requests(url: str, start: float, end: float) -> dict[str, float]:
    """Requests each model served during the window (counter increase, exact when scraped at both ends)."""
    expr = "sum by (model) (nv_inference_request_success)"
    before = {r["metric"].get("model", ""): float(r["value"][1]) for r in prom.query(url, expr, start)}
    after = {r["metric"].get("model", ""): float(r["value"][1]) for r in prom.query(url, expr, end)}
    return {model: value - before.get(model, 0.0) for model, value in after.items()}


def summary(rows: list[dict], served: dict[str, float]) -> tuple[list[str], list[list]]:
    """(header, rows) per model: requests served, mean and peak inferences/s, mean queue µs per request."""
    header = ["model", "requests served", "mean inferences/s", "peak inferences/s", "mean queue µs/request"]
    table = []
    for model in sorted({r["model"] for r in rows} | set(served)):
        tput = [r["value"] for r in rows if r["model"] == model and r["series"] == "inferences_per_s"]
        queue = [r["value"] for r in rows if r["model"] == model and r["series"] == "queue_us_per_request"]
        mean = lambda values: f"{sum(values) / len(values):,.1f}" if values else "-"  # noqa: E731
        table.append([model, f"{served.get(model, 0):,.0f}", mean(tput), f"{max(tput, default=0):,.1f}", mean(queue)])
    return header, table


def view(run: Path, url: str) -> tuple[tuple, Path] | None:
    """Collect the view for a run folder with window.json; write server_view.csv and .png. None without a window."""
    if not (run / WINDOW).exists():
        return None
    window = json.loads((run / WINDOW).read_text())
    end = min(window["end"], time.time())
    rows = collect(url, window["start"], end)
    with open(run / "server_view.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["series", "model", "t_s", "value"])
        writer.writeheader()
        writer.writerows(rows)
    return summary(rows, served_requests(url, window["start"], end)), plot(rows, run / "server_view.png")


def plot(rows: list[dict], path: Path) -> Path:
    """Inferences/s and queue time per request over the run, one line per model."""
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for ax, name, label in (
        (axes[0], "inferences_per_s", "inferences/s"),
        (axes[1], "queue_us_per_request", "queue µs/request"),
    ):
        for model in sorted({r["model"] for r in rows if r["series"] == name}):
            points = [(r["t_s"], r["value"]) for r in rows if r["series"] == name and r["model"] == model]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=model)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    axes[1].set_xlabel("seconds into the run")
    return save(fig, path)
