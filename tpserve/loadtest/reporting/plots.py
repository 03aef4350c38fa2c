"""PNG plots of measurements, written next to their CSV."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    """Lay out, write as PNG and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def throughput_vs_latency(rows: list[dict], path: Path) -> Path:
    """Throughput against p99 latency, one line per (model, protocol, batch)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in sorted({(r["model"], r["protocol"], r["batch"]) for r in rows}):
        points = sorted(
            (r["p99_ms"], r["throughput"], r["level"]) for r in rows if (r["model"], r["protocol"], r["batch"]) == key
        )
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{key[0]} {key[1]} b{key[2]}")
        for p99, tput, level in points:
            ax.annotate(f"{level:g}", (p99, tput), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.set_title("Throughput vs p99 latency, log scales (labels: load level)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)
