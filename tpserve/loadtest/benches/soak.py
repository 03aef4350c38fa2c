"""Soak: a bounded load for a long while, with the resident memory of tritonserver and of each
Python-backend stub sampled at a fixed interval. Leaks show as growth after the warm-up.

Writes soak.csv (one row per process and sample), soak.png and soak.md into the run folder.
"""

from __future__ import annotations

import csv
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import MeasurementError, ServerError
from tpserve.loadtest.reporting.html_page import write_html


@dataclass(frozen=True, kw_only=True)
class SoakSettings:
    """What to load, for how long, and how often to sample."""

    model: str
    seconds: float = 600.0
    interval: float = 10.0
    clients: int = 1  # closed-loop clients per protocol
    protocols: tuple[str, ...] = ("http", "grpc")
    warmup: float = 60.0  # growth is measured from the first sample at or after this
    max_growth_pct: float = 5.0


@dataclass
class Counts:
    """Requests sent and failed by the load threads (first failures kept for the report)."""

    ok: int = 0
    failed: int = 0
    errors: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, error: str | None) -> None:
        with self.lock:
            if error is None:
                self.ok += 1
                return
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(error)


def rss_mib(pid: int) -> float | None:
    """Resident set size of a process in MiB (None if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def served_processes(state_dir: Path) -> dict[str, int]:
    """Label -> pid of every process that `make serve` or `make cluster` runs from state_dir: each tritonserver
    and its stubs, each supervisor, Envoy and its keeper (labels name the replica where there are several). A
    record missing while a supervisor restarts its server leaves that server out of this sample."""
    import json

    from tpserve.common.endpoints import read_state
    from tpserve.server.triton.processes import children

    folders = sorted(p.parent for p in state_dir.glob("replica-*/server.json")) or [state_dir]
    found: dict[str, int] = {}
    for folder in folders:
        prefix = f"{folder.name} " if len(folders) > 1 else ""
        try:
            found.update({prefix + label: pid for label, pid in processes(read_state(folder).pid).items()})
            found[prefix + "supervisor"] = int(json.loads((folder / "supervisor.json").read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError, ServerError):
            continue
    keeper = _envoy_keeper(state_dir)
    if keeper:
        found["envoy keeper"] = keeper
        for n, child in enumerate(children(keeper)):  # one Envoy; a second while the keeper restarts it
            found["envoy" if n == 0 else f"envoy #{n}"] = child
    return found


def _envoy_keeper(state_dir: Path) -> int | None:
    from tpserve.server.stack import read_stack

    try:
        return read_stack(state_dir).envoy_pid
    except (OSError, ValueError, ServerError):  # no edge, or its record half-written
        return None


def processes(server_pid: int) -> dict[str, int]:
    """Label -> pid of tritonserver and each of its stubs ('<model> #<n>', by pid order)."""
    from tpserve.server.triton.processes import stubs

    found = {"tritonserver": server_pid}
    by_model: dict[str, list[int]] = {}
    for model, _, pid in stubs(server_pid):
        by_model.setdefault(model, []).append(pid)
    for model, pids in sorted(by_model.items()):
        for n, pid in enumerate(sorted(pids)):
            found[f"{model} #{n}"] = pid
    return found


def _client_loop(ep: Endpoint, model: str, arrays: dict, counts: Counts, stop: threading.Event) -> None:
    from tpserve.clients.infer import infer

    with ep.client() as client:
        while not stop.is_set():
            try:
                infer(ep, model, arrays, client=client)
                counts.add(None)
            except Exception as err:  # counted, never fatal: the soak goes on
                counts.add(str(err)[:300])


def _arrays(ep: Endpoint, model: str) -> dict:
    from tpserve.clients.inputs import plan_inputs
    from tpserve.clients.model_plan import plan
    from tpserve.clients.served import served_spec

    with ep.client() as client:
        return plan_inputs(plan(client, model, ep.headers), 1, None, served_spec(ep.repo, model))


def run(settings: SoakSettings, endpoints: list[Endpoint], sampled, out: Path) -> dict:
    """Load with settings.clients closed-loop clients per endpoint; sample RSS; write the run folder.

    sampled: a callable returning label -> pid of the processes to sample now (served_processes: a supervisor may
    restart the server), or None for a server that is not ours.
    """
    out.mkdir(parents=True, exist_ok=True)
    arrays, counts, stop = _arrays(endpoints[0], settings.model), Counts(), threading.Event()
    threads = [
        threading.Thread(target=_client_loop, args=(ep, settings.model, arrays, counts, stop), daemon=True)
        for ep in endpoints
        for _ in range(settings.clients)
    ]
    for thread in threads:
        thread.start()
    try:
        rows = _sample(settings, sampled, counts)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    return _write(settings, rows, counts, out)


def _sample(settings: SoakSettings, sampled, counts: Counts) -> list[dict]:
    """RSS rows per process (a server we did not start, sampled() None: one row of request counts per sample,
    RSS not sampled)."""
    rows, started = [], time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        found = sampled()
        if found is None:
            rows.append(
                {
                    "t_s": round(elapsed, 1),
                    "process": "tritonserver",
                    "pid": 0,
                    "rss_mib": float("nan"),
                    "requests": counts.ok + counts.failed,
                    "failed": counts.failed,
                }
            )
        for label, pid in (found or {}).items():
            rss = rss_mib(pid)
            if rss is not None:
                rows.append(
                    {
                        "t_s": round(elapsed, 1),
                        "process": label,
                        "pid": pid,
                        "rss_mib": round(rss, 2),
                        "requests": counts.ok + counts.failed,
                        "failed": counts.failed,
                    }
                )
        _progress(rows, elapsed)
        if elapsed >= settings.seconds:
            return rows
        time.sleep(max(0.0, settings.interval - (time.monotonic() - started - elapsed)))


def _progress(rows: list[dict], elapsed: float) -> None:
    now = [r for r in rows if r["t_s"] == rows[-1]["t_s"]]
    total = sum(r["rss_mib"] for r in now if r["rss_mib"] == r["rss_mib"])  # NaN: not sampled
    step(
        f"soak t={elapsed:5.0f} s: {now[0]['requests']:,} requests, {now[0]['failed']} failed, "
        f"RSS {total:,.0f} MiB over {len(now)} processes"
    )


def growth(rows: list[dict], warmup: float) -> list[dict]:
    """Per process (and in total): RSS at the first sample at or after warmup, at the end, and growth in %."""
    times = sorted({r["t_s"] for r in rows})
    start = next((t for t in times if t >= warmup), times[0])
    first = {r["process"]: r for r in rows if r["t_s"] == start}
    last = {r["process"]: r for r in rows if r["t_s"] == times[-1]}
    result = []
    for label in first:
        if label in last:
            a, b = first[label]["rss_mib"], last[label]["rss_mib"]
            same = first[label]["pid"] == last[label]["pid"]
            result.append({"process": label, "from_mib": a, "to_mib": b, "growth_pct": _pct(a, b), "same_pid": same})
    a, b = sum(r["from_mib"] for r in result), sum(r["to_mib"] for r in result)
    result.append(
        {
            "process": "total",
            "from_mib": round(a, 1),
            "to_mib": round(b, 1),
            "growth_pct": _pct(a, b),
            "same_pid": all(r["same_pid"] for r in result),
        }
    )
    return result


def _pct(a: float, b: float) -> float:
    return round(100.0 * (b - a) / a, 2) if a else 0.0


def _write(settings: SoakSettings, rows: list[dict], counts: Counts, out: Path) -> dict:
    if not rows:
        raise MeasurementError("the soak took no sample: is the server running? (`make status`)")
    with open(out / "soak.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    sampled = all(r["rss_mib"] == r["rss_mib"] for r in rows)  # NaN where the server is not ours
    table = growth(rows, settings.warmup) if sampled else []
    summary = {
        "model": settings.model,
        "seconds": rows[-1]["t_s"],
        "requests": counts.ok + counts.failed,
        "failed": counts.failed,
        "errors": counts.errors,
        "growth": table,
        "max_growth_pct": settings.max_growth_pct,
        "rss_sampled": sampled,
    }
    summary["goal_met"] = counts.failed == 0 and all(r["growth_pct"] < settings.max_growth_pct for r in table)
    plot(rows, settings.warmup, out / "soak.png")
    (out / "soak.md").write_text(markdown(summary, settings))
    write_html(out / "soak.md")
    return summary


def markdown(summary: dict, settings: SoakSettings) -> str:
    """The soak's summary: load, failures, RSS growth per process after the warm-up."""
    rate = summary["requests"] / summary["seconds"] if summary["seconds"] else 0.0
    lines = [
        f"# Soak: {summary['model']}",
        "",
        f"{summary['seconds']:.0f} s, {settings.clients} closed-loop client(s) per protocol over "
        f"{' + '.join(settings.protocols)}: {summary['requests']:,} requests ({rate:,.1f}/s), "
        f"{summary['failed']} failed. RSS (of our own servers) sampled every {settings.interval:g} s; "
        "growth from the first sample "
        f"at or after {settings.warmup:g} s (warm-up) to the last. Goal: 0 failed, growth < "
        f"{settings.max_growth_pct:g}% per process: {'met' if summary['goal_met'] else 'MISSED'}.",
        "",
        "| process | RSS after warm-up (MiB) | RSS at the end (MiB) | growth | same pid |",
        "|---|---:|---:|---:|---|",
    ]
    if not summary.get("rss_sampled", True):
        lines += ["| (not sampled: the server is not one we started, --url) | — | — | — | — |"]
    for r in summary["growth"]:
        lines.append(
            f"| {r['process']} | {r['from_mib']:.1f} | {r['to_mib']:.1f} | {r['growth_pct']:+.2f}% | "
            f"{'yes' if r['same_pid'] else 'no (restarted)'} |"
        )
    if summary["errors"]:
        lines += ["", "First failures:", *[f"- `{e}`" for e in summary["errors"]]]
    return "\n".join(lines) + "\n\n![RSS over time](soak.png)\n"


def plot(rows: list[dict], warmup: float, path: Path) -> Path:
    """RSS of each process over time, and throughput per sample interval."""
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    fig, (ax, rate_ax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1])
    for label in sorted({r["process"] for r in rows}):
        points = [(r["t_s"], r["rss_mib"]) for r in rows if r["process"] == label]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=label)
    ax.axvline(warmup, color="grey", linestyle=":", label="end of warm-up")
    ax.set_ylabel("RSS (MiB)")
    ax.legend(fontsize=7, loc="upper left")
    ticks = sorted({(r["t_s"], r["requests"]) for r in rows if r["process"] == "tritonserver"})
    rates = [(b[0], (b[1] - a[1]) / (b[0] - a[0])) for a, b in zip(ticks, ticks[1:]) if b[0] > a[0]]
    rate_ax.plot([r[0] for r in rates], [r[1] for r in rates], color="black")
    rate_ax.set_ylabel("requests/s")
    rate_ax.set_xlabel("seconds")
    return save(fig, path)
