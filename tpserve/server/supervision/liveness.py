"""Is tritonserver itself answering? One cheap check, independent of how many models it serves.

A frozen server (SIGSTOPped, deadlocked, swapping) keeps its process and its ports, so a process
check calls it alive while every request times out. The supervisor asks /v2/health/live with a short
timeout every `interval`: after `not_ready_after` misses in a row it answers "not ready" to load
balancers, after `kill_after` it kills the server's process group and restarts it. An exit is
described (code or signal) with the log's last lines, so a restart keeps its evidence.
"""

from __future__ import annotations

import re
import signal
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LivenessSettings:
    interval: float = 0.5  # seconds between checks
    timeout: float = 1.0  # a check that takes longer is a miss
    not_ready_after: int = 1  # misses in a row before readiness turns 503
    kill_after: int = 4  # misses in a row before the server is killed and restarted (0: never)


DEFAULT_LIVENESS = LivenessSettings()


def live(http_url: str, timeout: float) -> bool:
    """Whether the server answered GET /v2/health/live with 200 within timeout."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/live", timeout=timeout) as answer:
            return answer.status == 200
    except Exception:  # refused, reset, timed out: no answer
        return False


@dataclass
class Misses:
    """Consecutive missed liveness checks."""

    count: int = 0

    def add(self, ok: bool) -> int:
        self.count = 0 if ok else self.count + 1
        return self.count


def describe_exit(returncode: int | None) -> str:
    """A Popen returncode in words: 'exit code 1', 'killed by signal 9 (SIGKILL)', or 'status unknown'."""
    if returncode is None:
        return "status unknown (not our child, or already reaped)"
    if returncode < 0:
        return f"killed by signal {-returncode} ({signal.Signals(-returncode).name})"
    return f"exit code {returncode}"


def reap(pid: int) -> int | None:
    """The returncode of the server we started as pid (None if we did not start it or it still runs)."""
    from tpserve.server.triton.launcher import CHILDREN

    process = CHILDREN.pop(pid, None)
    if process is None:
        return None
    try:
        return process.wait(timeout=5)
    except Exception:  # still running (should not happen: it is gone from /proc)
        return None


FATAL = re.compile(r"terminate called|what\(\):|Signal \(\d+\) received|Segmentation fault|Aborted|out of memory")
ERROR = re.compile(r"^E\d{4} ")
HARMLESS = "CUDA driver version is insufficient"  # every ensemble on a host without a GPU
FRAME = re.compile(r"^\s*\d+# ")  # a backtrace frame


def crash_cause(path: Path, max_bytes: int = 256_000) -> list[str]:
    """The lines of the last start's log that say why the server died (the exception, the error, the
    signal; else its errors), without the backtrace that follows them: at most 6."""
    lines = log_tail(path, lines=100_000, max_bytes=max_bytes)
    found = [line for line in lines if FATAL.search(line)]
    found = found or [line for line in lines if ERROR.match(line) and HARMLESS not in line]
    return [line[:300] for line in found[-6:]]


def log_tail(path: Path, lines: int = 12, max_bytes: int = 64_000) -> list[str]:
    """The last lines of a log file (empty if unreadable)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - max_bytes))
            text = handle.read().decode(errors="replace").splitlines()
        return [line for line in text[text_start(text) :] if not FRAME.match(line)][-lines:]
    except OSError:
        return []


def text_start(lines: list[str]) -> int:
    """Index of the last server start's marker in a log's lines (0 if none)."""
    from tpserve.server.triton.launcher import START_MARK

    marks = [i for i, line in enumerate(lines) if line.startswith(START_MARK)]
    return marks[-1] if marks else 0
