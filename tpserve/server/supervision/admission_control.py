"""Admission by queue time: each replica's supervisor measures its models' queue time per request, every
INTERVAL_S, from tritonserver's own counters (nv_inference_queue_duration_us over nv_inference_request_success),
and marks a model whose queue time is over its budget in its region of the edge's admission table
(server/edge/admission_table.py) for HOLD_S; the edge refuses that model's new calls at once (HTTP 429, gRPC
UNAVAILABLE, with a retry hint) while every replica marks it (server/edge/cancel_notice.c). A queue that holds
requests and finishes none within an interval counts as that long. Refusing the excess keeps the latency of what
is admitted near the budget, instead of every request waiting longer as the queue grows.

Budgets come from `--queue-slo-ms`: "20" (every model), or "resnet50=20 *=50" (per model; * for the rest).
What it measured and refused is served as Prometheus text on the supervisor's readiness port, GET /metrics.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tpserve.common.errors import ServerError

INTERVAL_S = 0.25
HOLD_S = 0.6  # a mark outlives the next measurement: refusals do not lapse between two
COUNTERS = ("nv_inference_queue_duration_us", "nv_inference_request_success", "nv_inference_pending_request_count")
_LINE = re.compile(r"^(nv_inference_\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")
_MODEL = re.compile(r'(?:^|,)model="((?:[^"\\]|\\.)*)"')  # a label value, escapes included


@dataclass(frozen=True)
class QueueBudgets:
    """Queue-time budgets per model, in ms (0: none; the edge admits everything)."""

    default_ms: float = 0.0
    per_model: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, text: str) -> QueueBudgets:
        """'20' or 'resnet50=20 *=50'.

        Raises:
            ServerError: a budget that is not a positive number of ms.
        """
        default, per_model = 0.0, []
        for word in text.replace(",", " ").split():
            name, _, value = word.rpartition("=")
            try:
                ms = float(value)
            except ValueError:
                ms = -1.0
            if not ms > 0:
                raise ServerError(
                    f"QUEUE_SLO_MS={text!r}: {word!r} is not a budget; give ms > 0, as '20' or 'model=20 *=50'"
                )
            if name in ("", "*"):
                default = ms
            else:
                per_model.append((name, ms))
        return cls(default, tuple(per_model))

    def of(self, model: str) -> float:
        return dict(self.per_model).get(model, self.default_ms)

    @property
    def enabled(self) -> bool:
        return self.default_ms > 0 or bool(self.per_model)

    def to_arg(self) -> str:
        words = [f"{name}={ms:g}" for name, ms in self.per_model]
        return " ".join(words + ([f"*={self.default_ms:g}"] if self.default_ms else []))


def counters(text: str) -> dict[str, dict[str, float]]:
    """tritonserver's /metrics text: the COUNTERS per model, summed over versions."""
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match or match.group(1) not in COUNTERS:
            continue
        model = _MODEL.search(match.group(2))
        if model:
            name = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), model.group(1))
            per = found.setdefault(name, {})
            per[match.group(1)] = per.get(match.group(1), 0.0) + float(match.group(3))
    return found


@dataclass
class ModelState:
    """One model as the controller last saw it."""

    queue_us: float = 0.0  # total queue time so far (the counter)
    success: float = 0.0
    stalled_s: float = 0.0  # how long requests have waited with none finishing
    queue_ms: float = 0.0  # per request, over the last interval
    over: bool = False


@dataclass
class Controller:
    """Measures and marks; step() is one round on a scrape's text (run() loops over the server's metrics)."""

    budgets: QueueBudgets
    region: object  # admission_table.Region (or anything with mark(model, until_ns, queue_us) and refused(model))
    models: dict[str, ModelState] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def step(self, text: str, now_ns: int, elapsed_s: float = INTERVAL_S) -> None:
        with self.lock:
            for model, figures in counters(text).items():
                budget = self.budgets.of(model)
                if budget <= 0:
                    continue
                state = self.models.setdefault(model, ModelState())
                self._measure(state, figures, elapsed_s)
                state.over = state.queue_ms > budget
                until = now_ns + int(HOLD_S * 1e9) if state.over else 0
                self.region.mark(model, until, state.queue_ms * 1000)  # type: ignore[attr-defined]

    @staticmethod
    def _measure(state: ModelState, figures: dict[str, float], elapsed_s: float) -> None:
        queue = figures.get("nv_inference_queue_duration_us", 0.0)
        success = figures.get("nv_inference_request_success", 0.0)
        done = success - state.success
        if done > 0:
            state.queue_ms = (queue - state.queue_us) / done / 1000
            state.stalled_s = 0.0
        elif figures.get("nv_inference_pending_request_count", 0.0) > 0:
            state.stalled_s += elapsed_s  # waiting, and none finished: at least this long
            state.queue_ms = state.stalled_s * 1000
        else:
            state.queue_ms = 0.0
        if success < state.success:  # the server restarted: its counters began again
            state.queue_ms = 0.0
        state.queue_us, state.success = queue, success

    def prometheus(self) -> str:
        """What it measured and refused, as Prometheus text."""
        lines = [
            "# HELP tpserve_queue_time_per_request_ms Mean queue time per request over the last interval.",
            "# TYPE tpserve_queue_time_per_request_ms gauge",
            "# HELP tpserve_queue_budget_ms The queue-time budget the edge admits by.",
            "# TYPE tpserve_queue_budget_ms gauge",
            "# HELP tpserve_admission_refusing 1 while this replica marks the model over its budget.",
            "# TYPE tpserve_admission_refusing gauge",
            "# HELP tpserve_admission_refused_total Calls the edge refused for the model's queue time (replica 0).",
            "# TYPE tpserve_admission_refused_total counter",
        ]
        with self.lock:
            for model, state in sorted(self.models.items()):
                escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                label = f'{{model="{escaped}"}}'
                lines += [
                    f"tpserve_queue_time_per_request_ms{label} {state.queue_ms:.3f}",
                    f"tpserve_queue_budget_ms{label} {self.budgets.of(model):g}",
                    f"tpserve_admission_refusing{label} {int(state.over)}",
                    f"tpserve_admission_refused_total{label} {self.region.refused(model)}",  # type: ignore[attr-defined]
                ]
        return "\n".join(lines) + "\n"

    def run(self, metrics_url: str, stopping: threading.Event) -> None:
        """Every INTERVAL_S until stopping is set: scrape the server's metrics and step (a failed scrape: skipped)."""
        last = time.monotonic()
        while not stopping.wait(INTERVAL_S):
            try:
                with urllib.request.urlopen(metrics_url, timeout=1.0) as response:
                    text = response.read().decode()
            except OSError:
                continue
            now = time.monotonic()
            self.step(text, time.clock_gettime_ns(time.CLOCK_MONOTONIC), now - last)
            last = now


def start(budgets: QueueBudgets, table: Path, region: int, metrics_url: str, stopping: threading.Event) -> Controller:
    """A controller for this replica's region of the table, running on a daemon thread."""
    from tpserve.server.edge.admission_table import Region

    controller = Controller(budgets, Region(table, region))
    threading.Thread(target=controller.run, args=(metrics_url, stopping), name="admission", daemon=True).start()
    return controller
