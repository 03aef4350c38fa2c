"""Faults under load on a cluster (`make cluster`): Locust through Envoy while a replica is SIGKILLed, while
the model's Python-backend stub on one replica is SIGKILLed (its supervisor reloads the model there while the
replica stays in rotation), then while every replica is restarted one by one. Locust counts the failures; the
figures go to faults.md."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.locust_suite.run import LocustResult, LocustRun, run_locust


def _healthy(state_dir: Path, replicas: int) -> bool:
    from tpserve.server.edge.front import admin_socket, routable

    return routable(admin_socket(state_dir), replicas)


def _during_locust(run: LocustRun, state_dir: Path, out: Path, fault, delay: float) -> tuple[LocustResult, dict]:
    """Run Locust through Envoy; `delay` seconds in, call fault(); return (Locust's result, fault's figures)."""
    from tpserve.common.endpoints import read_state

    results: list[LocustResult] = []
    thread = threading.Thread(target=lambda: results.append(run_locust(run, read_state(state_dir), out)))
    thread.start()
    time.sleep(delay)
    figures = fault()
    thread.join()
    if not results:
        raise MeasurementError(f"Locust did not finish; see {out}/locust.log")
    return results[0], figures


def kill_replica(state_dir: Path, replicas: int, name: str = "replica-0") -> dict:
    """SIGKILL a replica's tritonserver; seconds until Envoy saw it down and until it routes to it again."""
    from tpserve.common.endpoints import read_state
    from tpserve.server.stack import replica_restarted

    victim, killed = read_state(state_dir / name).pid, time.monotonic()
    os.kill(victim, signal.SIGKILL)
    step(f"killed {name}'s tritonserver (pid {victim})")
    down = _wait(lambda: not _healthy(state_dir, replicas), 30)
    back = _wait(lambda: replica_restarted(state_dir, name, victim) and _healthy(state_dir, replicas), 120)
    return {"marked_down_s": round(down - killed, 2), "back_in_rotation_s": round(back - killed, 1)}


def kill_stub(state_dir: Path, model: str, name: str = "replica-0") -> dict:
    """SIGKILL model's stub on one replica; seconds until its supervisor calls the model ready again."""
    from tpserve.common.endpoints import read_state
    from tpserve.server.stack import replica_ready
    from tpserve.server.triton.processes import stubs

    server = read_state(state_dir / name).pid
    victims = [pid for found, _, pid in stubs(server) if found == model]
    if not victims:
        return {"skipped": f"{model} has no Python-backend stub on {name}"}
    killed = time.monotonic()
    os.kill(victims[0], signal.SIGKILL)
    step(f"killed {model}'s stub on {name} (pid {victims[0]})")
    healing = _wait(lambda: not replica_ready(state_dir, name, model), 10)
    back = _wait(lambda: replica_ready(state_dir, name, model), 120)
    return {"healing_seen_s": round(healing - killed, 2), "model_ready_again_s": round(back - killed, 1)}


def rolling_restart(state_dir: Path) -> dict:
    from tpserve.server.stack import restart_replicas

    return {"restarts": restart_replicas(state_dir)}


def _wait(condition, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError("the cluster did not reach the expected state in time")


def run(state_dir: Path, model: str, protocol: str, users: int, seconds: int, out: Path) -> list[dict]:
    """Every experiment, one Locust run each; rows with requests, failures and the fault's figures."""
    from tpserve.server.stack import read_stack

    replicas = len(read_stack(state_dir).replicas)
    locust = LocustRun(models=((model, 1),), protocol=protocol, users=users, spawn_rate=users, run_time_s=seconds)
    experiments = [  # (name, folder of its Locust run, fault, seconds into the run)
        ("SIGKILL of replica-0's tritonserver", "kill", lambda: kill_replica(state_dir, replicas), seconds / 4),
        (f"SIGKILL of {model}'s stub on replica-0", "stub", lambda: kill_stub(state_dir, model), seconds / 4),
        ("rolling restart of every replica", "rolling", lambda: rolling_restart(state_dir), 3.0),
    ]
    rows = []
    for name, slug, fault, delay in experiments:
        result, figures = _during_locust(locust, state_dir, out / slug, fault, delay)
        total = result.row()
        rows.append({"experiment": name, "requests": total["requests"], "failed": total["failures"], **figures})
        step(f"{name}: {total['failures']} failed of {total['requests']}")
        _wait(lambda: _healthy(state_dir, replicas), 120)
    _write(rows, out, locust, replicas)
    return rows


def _write(rows: list[dict], out: Path, locust: LocustRun, replicas: int) -> None:
    lines = [
        f"# Faults under load: {replicas} replicas behind Envoy, Locust {locust.users} users over "
        f"{locust.protocol}, {locust.run_time_s} s per experiment",
        "",
        "| experiment | requests | failed | details |",
        "|---|---:|---:|---|",
    ]
    for row in rows:
        details = ", ".join(f"{k} {v}" for k, v in row.items() if k not in ("experiment", "requests", "failed"))
        lines.append(f"| {row['experiment']} | {row['requests']:,} | {row['failed']} | {details} |")
    (out / "faults.md").write_text("\n".join(lines) + "\n")
