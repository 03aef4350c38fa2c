"""A started server held in the foreground, as a container's entry needs it: the logs of its state folder go to
stdout as they grow, SIGTERM or SIGINT stops everything as `stop` does (the supervisor drains first), and the
command ends when the supervisor does (its server gone for good: the container's restart policy decides)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

from tpserve.server.triton.processes import alive


def hold(state_dir: Path, stop, poll_s: float = 0.5) -> int:
    """Follow state_dir's logs until a signal (then stop(state_dir); 0) or the supervisor's end (1)."""
    asked = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: asked.set())
    logs = _Logs(state_dir)
    while not asked.is_set():
        logs.copy_new()
        _reap_orphans()
        if not any(alive(pid) for pid in supervisor_pids(state_dir)):
            logs.copy_new()
            print("foreground: the supervisor ended; stopping what is left", flush=True)
            stop(state_dir)
            return 1
        asked.wait(poll_s)
    print("foreground: stopping (the supervisor drains first)", flush=True)
    stop(state_dir)
    logs.copy_new()
    return 0


def _reap_orphans() -> None:
    """As a container's first process, collect the exit of every orphan handed to it (a stub whose tritonserver was
    killed), which would otherwise stay a zombie; the supervisor's own pid is read through its record, not waited."""
    import os

    if os.getpid() != 1:
        return
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no child left
            return
        if pid == 0:  # none has ended
            return


def supervisor_pids(state_dir: Path) -> list[int]:
    """The pids the supervisors of state_dir recorded (one per replica folder, or the folder's own)."""
    from tpserve.server.supervision.supervisor import STATE

    found = []
    for path in [state_dir / STATE, *state_dir.glob(f"replica-*/{STATE}")]:
        try:
            found.append(int(json.loads(path.read_text() or "{}")["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


class _Logs:
    """Every *.log under the state folder, each copied to stdout from where it was last read, line by line with its
    name in front."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.read: dict[Path, int] = {}

    def copy_new(self) -> None:
        for path in sorted(self.state_dir.rglob("*.log")):
            at = self.read.get(path, 0)
            try:
                with open(path, "rb") as handle:
                    at = at if path.stat().st_size >= at else 0  # rotated or truncated: from its start
                    handle.seek(at)
                    chunk = handle.read(1 << 20)
            except OSError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.read[path] = at + len(complete)
            name = str(path.relative_to(self.state_dir))
            for line in complete.decode(errors="replace").splitlines():
                sys.stdout.write(f"{name}: {line}\n")
        sys.stdout.flush()
