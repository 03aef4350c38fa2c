"""A load generator on cores of its own: the server's threads on the others for the length of one point.

A bench whose client runs on the server's host shares the cores with it; at tens of thousands of requests a
second the client's processes take several cores, and a server thread that holds a lock can be preempted by
them. Splitting the cores (the client on the last N, every thread of the server's session on the rest) is how
one host stands in for a client on another machine. The split is undone after the point, so the same server
is measured both ways, alternated.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from common.errors import MeasurementError


def split_cores(client: int, cores: set[int]) -> tuple[set[int], set[int]]:
    """(server cores, client cores): the last `client` of cores, and the rest.

    Raises:
        MeasurementError: fewer than client + 1 cores.
    """
    cores = sorted(cores)
    if client < 1 or client >= len(cores):
        raise MeasurementError(f"--client-cores {client}: this host gives {len(cores)} cores; leave the server one")
    return set(cores[:-client]), set(cores[-client:])


def session_tasks(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every thread of every process in the session that pid leads (the server and its backends' stubs)."""
    session = os.getsid(pid)
    tasks = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session:
                continue
            tasks += [int(t.name) for t in (entry / "task").iterdir()]
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue  # gone, or not ours
    return tasks


def pin(tasks: list[int], cores: set[int]) -> None:
    for task in tasks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(task, cores)


@contextlib.contextmanager
def client_on_own_cores(server_pid: int, client: int) -> Iterator[tuple[set[int], set[int]]]:
    """The server's session on the first of this process's cores; yields (the server's cores, the client's) for
    the caller's load generator; every thread back on all of them afterwards."""
    everything = set(os.sched_getaffinity(0))
    server, mine = split_cores(client, everything)
    pin(session_tasks(server_pid), server)
    try:
        yield server, mine
    finally:
        pin(session_tasks(server_pid), everything)


def describe(cores: set[int]) -> str:
    """{12, 13, 14, 15} -> '12-15'; gaps as commas."""
    ordered, runs = sorted(cores), []
    for core in ordered:
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
