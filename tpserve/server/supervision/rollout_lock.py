"""The rollout lock: one rollout per server at a time, and the supervisor keeps its hands off.
(The rollout itself is a client of the model-control API: operations/rollout.py.)

A rollout swaps a model's Python-backend stubs on purpose (the new version's start, the old
one's retire). The supervisor would take those exits for crashes and reload the model, so it
skips every model named in the lock while the rollout that holds it is alive.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from tpserve.common.errors import ServerError
from tpserve.server.triton.processes import alive

LOCK = "rollout.lock"


@contextlib.contextmanager
def rollout_lock(state_dir: Path, models: list[str]):
    """Hold the lock of state_dir for models; refuse when a live rollout holds it."""
    path = state_dir / LOCK
    _clear_stale(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        holder = _read(path)
        raise ServerError(
            f"another rollout (pid {holder.get('pid')}, models {holder.get('models')}) is running on this server; "
            f"wait for it to finish (or remove {path} if that process is gone)"
        ) from None
    with os.fdopen(fd, "w") as handle:
        json.dump({"pid": os.getpid(), "models": models}, handle)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def paused_models(state_dir: Path) -> set[str]:
    """The models a live rollout holds (empty when none runs)."""
    holder = _read(state_dir / LOCK)
    return set(holder.get("models", ())) if _alive(holder) else set()


def _clear_stale(path: Path) -> None:
    holder = _read(path)  # an empty file is a lock being written: not stale
    if holder and not _alive(holder):
        path.unlink(missing_ok=True)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _alive(holder: dict) -> bool:
    pid = holder.get("pid")
    return isinstance(pid, int) and alive(pid)
