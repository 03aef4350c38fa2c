"""Folders holding code a process will load (compiled kernels): ours, mode 0700, never a shared /tmp path.

torch's inductor puts compiled kernels (.so files it later dlopens) in /tmp/torchinductor_<user> unless told
otherwise, and creates that folder with exist_ok=True, checking no owner: a local user who creates it first,
with shard folders open to all, can swap in a kernel that the next server start loads. Triton-lang's cache
($TRITON_CACHE_DIR) is the same kind of folder. Every process that compiles or loads kernels takes both
from kernel_cache_env(), inside a folder it owns (the server's state folder, the build folder).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

KERNEL_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


class UnsafeFolderError(RuntimeError):
    """A folder we would load code from is not ours alone (inside tritonserver: no project imports here;
    the launcher turns it into a ServerError)."""


def check_private(path: Path) -> Path:
    """path, once shown to be a real folder (no link) owned by this user and writable by no one else."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolderError(f"{path} is not a folder (a link or a file): remove it; code is loaded from it")
    if info.st_uid != os.geteuid():
        raise UnsafeFolderError(
            f"{path} belongs to uid {info.st_uid}, not to this user ({os.geteuid()}): another user could put "
            "code there that we would load; remove it or choose another state folder"
        )
    if info.st_mode & 0o022:
        raise UnsafeFolderError(
            f"{path} has mode {stat.S_IMODE(info.st_mode):o}: others can write into it; `chmod 700 {path}`"
        )
    return path


def private_dir(path: Path) -> Path:
    """path created with mode 0700 (parents too), or checked when it exists: ours and closed to others."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # created meanwhile: checked below like any existing folder
            pass
    return check_private(path)


def kernel_cache_env(root: Path) -> dict[str, str]:
    """TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR in root/kernel-cache/, both private."""
    inductor = private_dir(Path(root).absolute() / "kernel-cache")
    triton = private_dir(inductor / "triton")
    return {"TORCHINDUCTOR_CACHE_DIR": str(inductor), "TRITON_CACHE_DIR": str(triton)}


def use_private_kernel_cache(default_root: Path | None = None) -> dict[str, str]:
    """This process's kernel folders: those the environment names, checked, or else default_root's
    (~/.cache/triton-serving when None), set in os.environ before torch first compiles."""
    given = {k: os.environ[k] for k in KERNEL_ENV if os.environ.get(k)}
    if len(given) == len(KERNEL_ENV):
        for value in given.values():
            private_dir(Path(value))
        return given
    env = kernel_cache_env(default_root or Path.home() / ".cache" / "triton-serving")
    os.environ.update(env)
    return env


def keep_inductor_headers_private(inductor_dir: str | Path) -> Path | None:
    """Point inductor's precompiled C++ headers inside our kernel folder; the folder, or None where this torch
    has no such setting.

    torch 2.14 keeps them in <temp dir>/torchinductor_<user>/precompiled_headers whatever TORCHINDUCTOR_CACHE_DIR
    says (torch._inductor.codecache._HEADER_DIR, fixed when that module is imported): a header another user put
    there would be compiled into our CPU kernels. Call it with torch imported, before the first compile.
    """
    from torch._inductor import codecache

    if not hasattr(codecache, "_HEADER_DIR"):
        return None
    headers = private_dir(Path(inductor_dir) / "precompiled_headers")
    if codecache._HEADER_DIR != str(headers):
        codecache._HEADER_DIR = str(headers)
        codecache._HEADER_LOCK_DIR = str(private_dir(headers / "locks"))
        remembered = getattr(codecache, "_precompile_header", None)  # remembers each header's path in the old folder
        clear = getattr(remembered, "cache_clear", None)  # (a build's folder is gone once it ends)
        if clear is not None:
            clear()
    return headers
