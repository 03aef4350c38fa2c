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


SHM_DIR = Path("/dev/shm")
SHM_PREFIXES = ("triton_python_backend_shm_region_",)  # what tritonserver's Python backend creates


def _mapped_shared_memory() -> set[str]:
    """Names of /dev/shm files that some process we can see has mapped."""
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone, or another user's
            continue
        names.update(
            line.split("/dev/shm/", 1)[1].split(" (deleted)")[0] for line in text.splitlines() if "/dev/shm/" in line
        )
    return names


def orphaned_shared_memory(min_age_s: float = 5.0) -> list[Path]:
    """Our uid's Python-backend regions that no process maps any more (left by a crashed or killed
    server); regions younger than min_age_s are spared (a starting server may not have mapped them yet)."""
    if not SHM_DIR.is_dir():
        return []
    mapped, now, uid = _mapped_shared_memory(), time.time(), os.getuid()
    found = []
    for path in SHM_DIR.iterdir():
        try:
            info = path.lstat()
        except OSError:
            continue
        if (
            path.name.startswith(SHM_PREFIXES)
            and info.st_uid == uid
            and path.name not in mapped
            and now - info.st_mtime >= min_age_s
        ):
            found.append(path)
    return found


def remove_orphaned_shared_memory(min_age_s: float = 5.0) -> int:
    """Remove what orphaned_shared_memory finds; return how many files went."""
    removed = 0
    for path in orphaned_shared_memory(min_age_s):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed
