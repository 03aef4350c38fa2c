"""The one module that reads /proc and ends process groups: is a process alive, what runs there, the stubs a
tritonserver started and their CPU time, ending a process group, shared memory nobody maps any more."""

from __future__ import annotations

import json
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


def supervises(pid: int, state_dir: Path) -> bool:
    """Whether pid runs our supervisor (`python -m tpserve.server supervise`) of state_dir: not a recycled pid,
    not another state dir's supervisor."""
    words = cmdline(pid).split(b"\0")
    if b"tpserve.server" not in words or b"supervise" not in words or b"--state-dir" not in words[:-1]:
        return False
    given = Path(os.fsdecode(words[words.index(b"--state-dir") + 1]))
    try:
        where = given if given.is_absolute() else Path(os.readlink(f"/proc/{pid}/cwd")) / given
        return where.resolve() == Path(state_dir).resolve()
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie does not), reaping it when it is our child."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
    except ChildProcessError:
        pass
    return bool(cmdline(pid))


def terminate_group(pid: int, timeout: float = 10.0, leader_only: bool = False) -> bool:
    """SIGTERM the process group led by pid (leader_only: its leader alone, which stops the rest itself), SIGKILL
    the group if the leader outlives timeout; return whether it was running."""
    try:
        if leader_only:
            os.kill(pid, signal.SIGTERM)
        else:
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


def children(pid: int) -> list[int]:
    """The pids whose parent is pid."""
    return sorted(child for child, _, stat in _processes() if stat[1] == str(pid))


def stubs(server_pid: int, repo: Path | None = None) -> list[tuple[str, str, int]]:
    """(model, version, pid) of every Python-backend stub that server_pid started (under repo, if given)."""
    found, root = [], repo.resolve().parts if repo is not None else ()
    for pid, argv, stat in _processes():
        if stat[1] == str(server_pid) and argv[0].endswith(STUB) and len(argv) > 1:
            parts = Path(argv[1].decode(errors="replace")).parts  # <repo>/<model>/<version>/model.py
            if len(parts) >= 3 and parts[: len(root)] == root:
                found.append((parts[-3], parts[-2], pid))
    return found


def end_orphaned_stubs(group: int) -> list[int]:
    """SIGKILL the Python-backend stubs left in process group `group` (a dead tritonserver's: it led its own
    group, and its stubs, handed to init, would keep their memory and shared memory for good); their pids. Only
    orphaned stubs are touched: a process of that group that runs anything else, or a stub whose parent is a
    tritonserver (the group's id taken again by a live server), is left alone."""
    ended = []
    for pid, argv, stat in _processes():
        if not (argv and argv[0].endswith(STUB) and len(stat) > 2 and stat[2] == str(group) and pid != group):
            continue
        if not is_tritonserver(int(stat[1])):
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except ProcessLookupError:
                continue
    return ended


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
        names.update(_shm_names(text))
    return names


def _shm_names(maps: str) -> set[str]:
    """Names of the /dev/shm files in the text of a /proc/<pid>/maps."""
    return {line.split("/dev/shm/", 1)[1].split(" (deleted)")[0] for line in maps.splitlines() if "/dev/shm/" in line}


REGIONS = "shm_regions.json"  # in a server's state folder: the /dev/shm regions it was seen to use


def regions_of(server_pid: int) -> set[str]:
    """Python-backend regions mapped by server_pid or named on its stubs' command lines."""
    names = set()
    for pid in [server_pid, *(p for _, _, p in stubs(server_pid))]:
        try:
            text = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            text = ""
        names.update(_shm_names(text))
        names.update(a.decode(errors="replace") for a in cmdline(pid).split(b"\0")[1:3])
    return {n for n in names if n.startswith(SHM_PREFIXES) and "/" not in n}


def remember_regions(state_dir: Path, names: set[str]) -> set[str]:
    """Add names to the state folder's record of its server's regions; return the whole record."""
    known = recorded_regions(state_dir)
    if names - known:
        (state_dir / REGIONS).write_text(json.dumps(sorted(known | names)))
    return known | names


def recorded_regions(state_dir: Path) -> set[str]:
    try:
        return {n for n in json.loads((state_dir / REGIONS).read_text()) if isinstance(n, str)}
    except (OSError, ValueError):
        return set()


def remove_regions(state_dir: Path, extra: frozenset[str] | set[str] = frozenset()) -> int:
    """Remove this state folder's recorded regions (and extra) that no process maps any more; other
    servers' regions, of this user too, are never touched. Returns how many files went."""
    names, mapped, uid, removed = recorded_regions(state_dir) | set(extra), _mapped_shared_memory(), os.getuid(), 0
    for name in sorted(names - mapped):
        path = SHM_DIR / name
        try:
            if path.lstat().st_uid == uid and name.startswith(SHM_PREFIXES):
                path.unlink()
                removed += 1
        except OSError:
            pass
    if not names & mapped:
        (state_dir / REGIONS).unlink(missing_ok=True)
    return removed
