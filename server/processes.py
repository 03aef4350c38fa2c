"""Processes this project watches or started: is one alive, what runs there, ending a process group."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def cmdline(pid: int) -> bytes:
    """The process' command line (NUL-separated); empty for a zombie or a process that is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie does not), reaping it when it is our child."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
    except ChildProcessError:
        pass
    return bool(cmdline(pid))


def terminate_group(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM the process group led by pid, SIGKILL it after timeout; return whether it was running."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        os.killpg(pid, signal.SIGKILL)
    return True
