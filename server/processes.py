"""The one module that reads /proc and ends process groups: is a process alive, what runs there, the stubs a
tritonserver started and their CPU time, ending a process group, shared memory nobody maps any more."""

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


def is_tritonserver(pid: int) -> bool:
    """Whether pid runs tritonserver (not a zombie, not a recycled pid running something else)."""
    return b"tritonserver" in cmdline(pid)


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
    alive(pid)  # reaps it when it is our child
    return True


STUB = b"triton_python_backend_stub"


def _processes():
    """(pid, argv, fields of /proc/<pid>/stat after the command name) of every process we can read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        yield int(entry.name), argv, stat


def stubs(server_pid: int, repo: Path | None = None) -> list[tuple[str, str, int]]:
    """(model, version, pid) of every Python-backend stub that server_pid started (under repo, if given)."""
    found, root = [], repo.resolve().parts if repo is not None else ()
    for pid, argv, stat in _processes():
        if stat[1] == str(server_pid) and argv[0].endswith(STUB) and len(argv) > 1:
            parts = Path(argv[1].decode(errors="replace")).parts  # <repo>/<model>/<version>/model.py
            if len(parts) >= 3 and parts[: len(root)] == root:
                found.append((parts[-3], parts[-2], pid))
    return found


def stub_pids(server_pid: int, repo: Path | None = None) -> dict[str, set[int]]:
    """Model name -> pids of the server's Python-backend stubs (children of server_pid; with repo, only
    those of the repository's models, not of models loaded through the API from a temporary folder)."""
    found: dict[str, set[int]] = {}
    for model, _, pid in stubs(server_pid, repo):
        found.setdefault(model, set()).add(pid)
    return found


def instance_cpu_seconds(model: str, server_pid: int) -> dict[str, float]:
    """CPU seconds used so far by each stub process of `model`'s instances in server_pid's server (another server's
    stubs, or an orphan of a killed one, may carry the same instance names).

    Triton 2.51's statistics API counts per model, not per instance; the stub processes carry the instance name
    (e.g. digits_cnn_0_1) in their command line, so their CPU time shows which instances executed. The time is
    the scheduler's, in nanoseconds, summed over the process' threads (its 10 ms ticks miss a small model's work)."""
    found = {}
    for pid, argv, stat in _processes():
        if argv and argv[0].endswith(STUB) and stat[1] == str(server_pid):
            name = next((a.decode() for a in argv if a.decode().startswith(f"{model}_") and a[-1:].isdigit()), None)
            if name and name[len(model) + 1 :].replace("_", "").isdigit():
                found[name] = _cpu_seconds(pid, stat)
    return found


def _cpu_seconds(pid: int, stat: list[str]) -> float:
    """The process' CPU time: its threads' scheduler time (ns), or its stat ticks where schedstat is missing."""
    total, read = 0, False
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        tasks = []
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
            read = True
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return total / 1e9 if read else (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


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
