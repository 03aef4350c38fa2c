"""An SLO watchdog for Locust: a run whose p99 or failure ratio passes its threshold fails."""

from __future__ import annotations

import logging
import os

import gevent
from locust import events

P99_MS = float(os.environ.get("SLO_P99_MS", "0"))
FAIL_RATIO = float(os.environ.get("SLO_FAIL_RATIO", "-1"))
GRACE_REQUESTS = int(os.environ.get("SLO_GRACE_REQUESTS", "20"))


def breaches(stats, p99_ms: float, fail_ratio: float, grace: int = GRACE_REQUESTS) -> list[str]:
    """The thresholds the aggregated stats pass (empty: within the SLO)."""
    total = stats.total
    if total.num_requests < grace:
        return []
    found = []
    if p99_ms > 0 and total.get_response_time_percentile(0.99) > p99_ms:
        found.append(f"p99 {total.get_response_time_percentile(0.99):.1f} ms > {p99_ms:g} ms")
    if fail_ratio >= 0 and total.fail_ratio > fail_ratio:
        found.append(f"failure ratio {total.fail_ratio:.3f} > {fail_ratio:g}")
    return found


def _watch(environment):
    while True:
        gevent.sleep(1)
        found = breaches(environment.runner.stats, P99_MS, FAIL_RATIO)
        if found:
            logging.error("SLO breached: %s; stopping the run", "; ".join(found))
            environment.process_exit_code = 3
            environment.runner.quit()
            return


@events.init.add_listener
def _start_watchdog(environment, **_):
    from locust.runners import WorkerRunner

    if (P99_MS > 0 or FAIL_RATIO >= 0) and not isinstance(environment.runner, WorkerRunner):
        gevent.spawn(_watch, environment)


@events.quitting.add_listener
def _final_check(environment, **_):
    found = breaches(environment.stats, P99_MS, FAIL_RATIO, grace=1)
    if found:
        logging.error("SLO breached over the whole run: %s", "; ".join(found))
        environment.process_exit_code = 3
