"""Start and stop the supervisor as a detached process (what `make serve` and `make stop` do)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tpserve.common.errors import ServerError
from tpserve.server.supervision.probes import DEFAULT_PROBES, ProbeSettings
from tpserve.server.supervision.supervisor import DEFAULT_RETRY, STATE, RetrySettings
from tpserve.server.triton import launcher
from tpserve.server.triton.processes import alive


def start_supervised(
    settings: launcher.ServerSettings,
    health_port: int,
    drain: float = 0.0,
    env: dict | None = None,
    probes: ProbeSettings = DEFAULT_PROBES,
    retry: RetrySettings = DEFAULT_RETRY,
) -> dict:
    """Spawn `python -m tpserve.server supervise` in its own session; return its state once the server is ready.

    env: variables added to the supervisor's (and so the server's) environment, e.g. CUDA_VISIBLE_DEVICES.

    Raises:
        ServerError: a port is taken, or the server did not come up (the supervisor's reason).
    """
    launcher.refuse_running(settings.state_dir)  # before its record goes: `make stop` finds a supervisor by it
    launcher.check_ports_free(settings)
    launcher.check_port_free(settings.host, "health", health_port)
    launcher.private_state(settings.state_dir)
    path = settings.state_dir / STATE
    path.unlink(missing_ok=True)
    ports = [settings.http_port, settings.grpc_port, settings.metrics_port, health_port]
    command = [
        sys.executable,
        "-m",
        "tpserve.server",
        "supervise",
        "--repo",
        str(settings.repo),
        "--host",
        settings.host,
        "--timeout",
        str(settings.startup_timeout),
        "--state-dir",
        str(settings.state_dir),
        "--drain",
        str(drain),
        "--ports",
        *map(str, ports),
        "--probes",
        str(probes.interval),
        str(probes.timeout),
        str(probes.threshold),
        "--internal",
        ",".join(settings.internal),
        "--cancelled-calls",
        str(settings.cancelled_calls or ""),
        "--admission-table",
        str(settings.admission_table or ""),
        "--queue-slo",
        settings.queue_budgets,
        "--backlog-slot",
        str(settings.backlog_slot),
        "--http-checks",
        str(settings.http_checks or ""),
        "--http-check-limits",
        settings.http_check_limits,
        "--max-waiting-calls",
        str(settings.max_waiting),
        *(["--grpc-streaming"] if settings.grpc_streaming else []),
        "--retry",
        str(retry.first_s),
        str(retry.max_s),
        *settings.tuning.cli_args(),
    ]
    log = open(settings.state_dir / "supervisor.log", "a")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
    )
    return _await(process, path, settings.startup_timeout + 30)


def _await(process: subprocess.Popen, path: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            state = json.loads(path.read_text() or "{}")
            if state.get("error"):
                process.wait(timeout=60)
                raise ServerError(state["error"])
            if state.get("ready"):
                return state
        if process.poll() is not None:
            raise ServerError(f"the supervisor exited with code {process.returncode}; see {path.parent}/supervisor.log")
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    raise ServerError(f"the supervised server was not ready after {timeout:.0f} s; see {path.parent}/supervisor.log")


def stop_supervisor(state_dir: Path, timeout: float = 60.0) -> bool:
    """Stop the supervisor of state_dir (it drains, then stops its server) and wait; return whether one ran."""
    pid = signal_supervisor(state_dir)
    if pid is None:
        return False
    await_supervisor(state_dir, pid, timeout)
    return True


def signal_supervisor(state_dir: Path, drain: bool = True) -> int | None:
    """SIGTERM the supervisor of state_dir (it drains, then stops its server), or SIGINT (drain=False: it stops
    at once); its pid, None if none ran."""
    path = state_dir / STATE
    if not path.exists():
        return None
    pid = launcher.supervisor_of(state_dir)  # a record whose pid is gone or runs something else now: no signal
    try:
        if pid is None:
            raise ProcessLookupError
        os.kill(pid, signal.SIGTERM if drain else signal.SIGINT)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
        return None
    return pid


def await_supervisor(state_dir: Path, pid: int, timeout: float = 60.0) -> None:
    """Wait for a signalled supervisor to exit (up to timeout), then forget its record."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    (state_dir / STATE).unlink(missing_ok=True)
