"""Reconciliation: Locust and perf_analyzer on the same model at matched load.

Both run closed loop with the same number of outstanding requests (perf_analyzer's
concurrency = Locust's users, no wait time), batch 1, one after the other against the same
server. Their p50 latencies should agree within 15%; where they do not, the report says why.
Locust records response times below 100 ms rounded to whole milliseconds, so compare on a
model whose p50 is well above 1 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TOLERANCE = 0.15


@dataclass(kw_only=True)
class Reconciliation:
    model: str
    protocol: str
    concurrency: int
    perf_p50_ms: float
    locust_p50_ms: float
    perf_tput: float
    locust_tput: float
    perf_stable: bool = True
    perf_spread_pct: float = 0.0

    @property
    def gap(self) -> float:
        return abs(self.locust_p50_ms - self.perf_p50_ms) / self.perf_p50_ms

    @property
    def agrees(self) -> bool:
        return self.gap <= TOLERANCE


def reconcile(state, ep, analyzer, model: str, concurrency: int, seconds: int, out: Path) -> Reconciliation:
    """Measure with perf_analyzer, then Locust, at the same closed-loop concurrency."""
    from tpserve.loadtest.locust_suite.run import LocustRun, run_locust
    from tpserve.loadtest.perf.sweep import Sweep, run_sweep

    sweep = Sweep(
        model,
        protocol=ep.protocol,
        concurrency=(concurrency,),
        measurement_ms=seconds * 1000 // 3,
        max_trials=10,
        stability_percent=25,
    )
    (perf_row,) = run_sweep(sweep, ep, analyzer, out / "raw")
    run = LocustRun(
        models=((model, 1),),
        protocol=ep.protocol,
        users=concurrency,
        spawn_rate=concurrency,
        run_time_s=seconds,
        headers=ep.headers,
    )
    locust = next(r for r in run_locust(run, state, out / "locust").rows if r["name"] != "Aggregated")
    return Reconciliation(
        model=model,
        protocol=ep.protocol,
        concurrency=concurrency,
        perf_p50_ms=perf_row["p50_ms"],
        locust_p50_ms=locust["p50_ms"],
        perf_tput=perf_row["throughput"],
        locust_tput=locust["throughput"],
        perf_stable=perf_row["stable"] == "yes",
        perf_spread_pct=perf_row["spread_pct"],
    )


def markdown(results: list[Reconciliation]) -> str:
    """The figures side by side, the verdict, and why a gap may exist."""
    lines = [
        "| model | proto | concurrency | perf_analyzer p50 ms | Locust p50 ms | gap | verdict | "
        "perf_analyzer infer/s | Locust req/s |",
        "|" + "---|" * 9,
    ]
    for r in results:
        verdict = "agree (≤ 15%)" if r.agrees else "differ (> 15%)"
        if not r.perf_stable:
            verdict += f"; perf_analyzer unstable ±{r.perf_spread_pct / 2:.0f}%"
        lines.append(
            f"| {r.model} | {r.protocol} | {r.concurrency} | {r.perf_p50_ms:.2f} | {r.locust_p50_ms:.1f} | "
            f"{r.gap:.0%} | {verdict} | {r.perf_tput:.1f} | {r.locust_tput:.1f} |"
        )
    if any(not r.agrees for r in results):
        lines += [
            "",
            "Why they can differ: Locust rounds times below 100 ms to whole milliseconds; its users share "
            "one gevent loop (and, here, the server's 2 cores), so client-side queueing counts as latency; "
            "perf_analyzer's C++ client measures with microsecond clocks and less overhead.",
        ]
    return "\n".join(lines)
