"""The in-process torch backend's native library, built on the serving host for the serving interpreter.

triton_models/inprocess/native/shim.c starts an interpreter inside tritonserver; it has to be compiled against this
host's libpython (whose symbols the server then carries), so it is built when a server starts on a repository
that asks for it: `backend: "torch_inprocess"`. Needs a C compiler (cc, or $CC), the Python headers and a shared
libpython: what torch.compile needs on a GPU host already.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

from tpserve.common.errors import ServerError
from tpserve.paths import TOOLS

BACKEND = "torch_inprocess"
LIBRARY = f"libtriton_{BACKEND}.so"
BUILT = TOOLS / "inprocess"  # built once per set of inputs (tpserve/common/native_build.py), copied per server


def uses_inprocess(repo: Path) -> bool:
    """Whether a model of the repository names the in-process backend."""
    return any(f'"{BACKEND}"' in path.read_text() for path in repo.glob("*/config.pbtxt"))


def build_inprocess(backends: Path) -> Path:
    """The in-process backend's library in backends/torch_inprocess/ (compiled into .tools/inprocess/ when an input
    changed, copied from there); return its path.

    Raises:
        ServerError: no C compiler, no Python headers, or no shared libpython (what to install is named).
    """
    built = build_native()
    target = backends / BACKEND
    target.mkdir(parents=True, exist_ok=True)
    partial = target / f".{LIBRARY}.partial"
    shutil.copyfile(built, partial)  # the server's backends folder holds its own copy
    partial.replace(target / LIBRARY)
    return target / LIBRARY


def build_native(force: bool = False) -> Path:
    """The library in .tools/inprocess/, compiled when an input changed (tpserve/common/native_build.py).

    Raises:
        ServerError: no C compiler, no Python headers, or no shared libpython (what to install is named).
    """
    from tpserve.common import native_build
    from tpserve.triton_models import INPROCESS_SHIM, INPROCESS_SOURCES

    include, library = _toolchain()
    arguments = [
        f"-I{include}",
        f"-I{INPROCESS_SHIM.parent}",
        str(library),
        f"-Wl,-rpath,{library.parent}",
        f'-DPYTHON_EXECUTABLE="{_plain(sys.executable)}"',
        f'-DPYTHON_LIBRARY="{library.name}"',
        "-ldl",
        "-lpthread",
    ]
    instead = "or serve the model with the Python backend (build it without --inprocess)"
    return native_build.build_library(
        INPROCESS_SOURCES, BUILT / LIBRARY, "the in-process backend", instead, arguments, force
    )


def _toolchain() -> tuple[str, Path]:
    """The Python headers' folder and the shared libpython the library links (a compiler is checked first)."""
    from tpserve.common.native_build import c_compiler

    if c_compiler() is None:
        raise ServerError(
            f"the in-process backend ({BACKEND}) is built on this host and no C compiler was found ($CC, cc or gcc): "
            "install gcc, or serve the model with the Python backend (build it without --inprocess)"
        )
    version = sysconfig.get_config_var("VERSION")
    include = sysconfig.get_config_var("INCLUDEPY") or ""
    if not (Path(include) / "Python.h").exists():
        raise ServerError(
            f"the in-process backend needs the Python {version} headers ({include}/Python.h is missing): "
            f"install python{version}-dev"
        )
    return include, _libpython(version)


def _libpython(version: str) -> Path:
    names = [sysconfig.get_config_var("INSTSONAME"), f"libpython{version}.so.1.0", f"libpython{version}.so"]
    folders = [sysconfig.get_config_var(k) for k in ("LIBDIR", "LIBPL")] + [
        f"/usr/lib/{sysconfig.get_config_var('MULTIARCH') or ''}"
    ]
    for folder in filter(None, folders):
        for name in filter(None, names):
            if ".so" in name and (Path(folder) / name).exists():
                return Path(folder) / name
    raise ServerError(
        f"the in-process backend needs a shared libpython{version} and this Python has none "
        f"(looked in {[f for f in folders if f]}): install libpython{version}, or use a Python built with "
        "--enable-shared"
    )


def _plain(path: str) -> str:
    if any(c in path for c in '"\\\n'):
        raise ServerError(f"the Python executable's path {path!r} has a quote or backslash: the backend cannot name it")
    return path
