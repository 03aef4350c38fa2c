"""The replay's report: recorded and replayed side by side (requests per second over time, latency percentiles
per model, status counts), and how closely the replay kept to the recording's timing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from tpserve.loadtest.reporting.html_page import write_html
from tpserve.loadtest.workloads.recorded import correlation, per_second


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (nan without values)."""
    return float(np.percentile(values, q, method="nearest")) if values else float("nan")


def outcome(protocol: str, status) -> str:
    """A status as 'ok' or what it was ('http 400', 'grpc 3', the replay's error text)."""
    if status in ("ok", 200) or (protocol == "grpc" and status == 0):
        return "ok"
    return f"{protocol} {status}" if isinstance(status, int) else str(status)


def _ms(value: float) -> str:
    return "—" if value != value else f"{value:.2f}"  # nan: no durations (a generated workload)


def summarize(replayed: dict, speed: float) -> dict:
    """The figures of a replay (run_replay's answer) against its recording."""
    items, sent = replayed["items"], replayed["results"]["sent"]
    start = min(r.arrival_us for r in replayed["recorded"])
    recorded = sorted(replayed["recorded"], key=lambda r: r.arrival_us)
    replayable = [r for r in recorded if r.inputs and (r.model in {i.model for i in items})]
    seconds = int(max(i.offset_s for i in items)) + 1
    want = per_second([i.offset_s for i in items], seconds)
    got = per_second([s["sent_s"] for s in sent], seconds)
    return {
        "speed": speed,
        "recorded_total": len(replayable),
        "replayed_total": len(sent),
        "total_diff_pct": round(100 * (len(sent) - len(items)) / len(items), 2),
        "per_second_r": round(correlation(want, got), 4),
        "behind_ms": round(replayed["results"]["behind_s"] * 1000, 1),
        "recorded_per_second": per_second([(r.arrival_us - start) / 1e6 / speed for r in replayable], seconds),
        "replayed_per_second": got,
        "left_out": dict(replayed["left_out"]),
        "models": _models(replayable, sent),
        "statuses": _statuses(replayable, sent),
    }


def _models(recorded, sent) -> list[dict]:
    rows = []
    for model in sorted({r.model for r in recorded}):
        durations = [r.duration_us / 1000 for r in recorded if r.model == model and r.duration_us]
        latencies = [s["ms"] for s in sent if s["model"] == model]
        rows.append(
            {
                "model": model,
                "recorded": sum(r.model == model for r in recorded),
                "replayed": len(latencies),
                "recorded_p50_ms": percentile(durations, 50),
                "recorded_p99_ms": percentile(durations, 99),
                "replayed_p50_ms": percentile(latencies, 50),
                "replayed_p99_ms": percentile(latencies, 99),
            }
        )
    return rows


def _statuses(recorded, sent) -> list[dict]:
    before = Counter((r.protocol, outcome(r.protocol, r.status)) for r in recorded)
    after = Counter((s["protocol"], outcome(s["protocol"], s["status"])) for s in sent)
    keys = sorted(set(before) | set(after))
    return [{"protocol": p, "status": o, "recorded": before[(p, o)], "replayed": after[(p, o)]} for p, o in keys]


def write_report(summary: dict, out: Path, header: str) -> Path:
    """replay.md and replay.png in out; returns the markdown's path."""
    lines = [
        "# Replay",
        "",
        header,
        "",
        f"- requests: recorded {summary['recorded_total']:,}, replayed {summary['replayed_total']:,} "
        f"({summary['total_diff_pct']:+.2f}% against the schedule)",
        f"- requests per second, replayed against recorded: correlation {summary['per_second_r']:.4f}; "
        f"the latest send left {summary['behind_ms']:.1f} ms behind its time",
        f"- left out: {summary['left_out'] or 'nothing'}",
        "",
        "| model | recorded | replayed | recorded p50 ms (server) | recorded p99 ms | replayed p50 ms (client) "
        "| replayed p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {m['model']} | {m['recorded']:,} | {m['replayed']:,} | {_ms(m['recorded_p50_ms'])} | "
        f"{_ms(m['recorded_p99_ms'])} | {_ms(m['replayed_p50_ms'])} | {_ms(m['replayed_p99_ms'])} |"
        for m in summary["models"]
    ]
    lines += ["", "| protocol | status | recorded | replayed |", "|---|---|---:|---:|"]
    lines += [
        f"| {s['protocol']} | {s['status']} | {s['recorded']:,} | {s['replayed']:,} |" for s in summary["statuses"]
    ]
    lines += [
        "",
        "Recorded latency is the edge's (arrival to last byte sent); replayed is the client's. A workload's "
        "'recorded' side is what it generated (no latency).",
        "",
    ]
    lines += ["![requests per second](replay.png)", ""]
    path = out / "replay.md"
    path.write_text("\n".join(lines))
    _plot(summary, out / "replay.png")
    write_html(path)
    return path


def _plot(summary: dict, path: Path) -> Path:
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    recorded, replayed = summary["recorded_per_second"], summary["replayed_per_second"]
    ax.plot(range(len(recorded)), recorded, label=f"recorded (time / {summary['speed']:g})", lw=1.2)
    ax.plot(range(len(replayed)), replayed, label="replayed", lw=1.2, ls="--")
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("requests per second")
    ax.set_title(f"Replay: per-second correlation {summary['per_second_r']:.3f}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def compare_recordings(original: list, replayed: list, speed: float = 1.0) -> dict:
    """What a server saw of a replay (its own recording) against the recording replayed: requests per second
    (correlation), the total, and each model's shape histogram (identical or not). Requests refused before the
    server (nothing read) are left out on both sides."""
    from tpserve.common.traffic import shape_histogram

    first = [r for r in original if r.inputs]
    second = [r for r in replayed if r.inputs]
    t0, t1 = min(r.arrival_us for r in first), min(r.arrival_us for r in second)
    offsets_a = [(r.arrival_us - t0) / 1e6 / speed for r in first]
    offsets_b = [(r.arrival_us - t1) / 1e6 for r in second]
    seconds = int(max(offsets_a + offsets_b)) + 1
    a, b = per_second(offsets_a, seconds), per_second(offsets_b, seconds)
    hist_a, hist_b = shape_histogram(first), shape_histogram(second)
    differing = sorted(m for m in set(hist_a) | set(hist_b) if hist_a.get(m) != hist_b.get(m))
    return {
        "speed": speed,
        "recorded_total": len(first),
        "replayed_total": len(second),
        "total_diff_pct": round(100 * (len(second) - len(first)) / len(first), 3),
        "per_second_r": round(correlation(a, b), 4),
        "recorded_per_second": a,
        "replayed_per_second": b,
        "shapes_identical": not differing,
        "shapes_differ_for": differing,
        "signatures": sum(len(h) for h in hist_a.values()),
        "protocols": dict(Counter(r.protocol for r in first)),
        "replayed_protocols": dict(Counter(r.protocol for r in second)),
    }


def write_comparison(found: dict, out: Path, header: str) -> Path:
    """recordings.md and recordings.png: the server's two recordings side by side."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# The replay as the server saw it",
        "",
        header,
        "",
        "| figure | recorded | replayed (the server's recording of the replay) |",
        "|---|---:|---:|",
        f"| requests (inputs read) | {found['recorded_total']:,} | {found['replayed_total']:,} "
        f"({found['total_diff_pct']:+.3f}%) |",
        f"| by protocol | {found['protocols']} | {found['replayed_protocols']} |",
        f"| per-second request counts, correlation | | {found['per_second_r']:.4f} |",
        f"| shape histogram ({found['signatures']} signatures) | | "
        f"{'identical' if found['shapes_identical'] else 'differs for ' + ', '.join(found['shapes_differ_for'])} |",
        "",
        "![requests per second](recordings.png)",
        "",
    ]
    path = out / "recordings.md"
    path.write_text("\n".join(lines))
    _plot(found, out / "recordings.png")
    return path
