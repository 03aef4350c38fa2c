"""The in-process torch backend's native library, built on the serving host for the serving interpreter.

triton_models/inprocess/native/shim.c starts an interpreter inside tritonserver; it has to be compiled against this
host's libpython (whose symbols the server then carries), so it is built when a server starts on a repository
that asks for it: `backend: "torch_inprocess"`. Needs a C compiler (cc, or $CC), the Python headers and a shared
libpython: what torch.compile needs on a GPU host already.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from tpserve.common.errors import ServerError

BACKEND = "torch_inprocess"
LIBRARY = f"libtriton_{BACKEND}.so"


def uses_inprocess(repo: Path) -> bool:
    """Whether a model of the repository names the in-process backend."""
    return any(f'"{BACKEND}"' in path.read_text() for path in repo.glob("*/config.pbtxt"))


def build_inprocess(backends: Path) -> Path:
    """Compile the shim into backends/torch_inprocess/; return the library's path.

    Raises:
        ServerError: no C compiler, no Python headers, or no shared libpython (what to install is named).
    """
    from tpserve.triton_models import INPROCESS_SHIM, INPROCESS_SOURCES

    compiler, include, library = _toolchain()
    target = backends / BACKEND
    target.mkdir(parents=True, exist_ok=True)
    partial = target / f".{LIBRARY}.partial"
    command = [
        compiler,
        "-O2",
        "-shared",
        "-fPIC",
        "-o",
        str(partial),
        *(str(path) for path in INPROCESS_SOURCES),
        f"-I{include}",
        f"-I{INPROCESS_SHIM.parent}",
        str(library),
        f"-Wl,-rpath,{library.parent}",
        f'-DPYTHON_EXECUTABLE="{_plain(sys.executable)}"',
        f'-DPYTHON_LIBRARY="{library.name}"',
        "-ldl",
        "-lpthread",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ServerError(
            f"building the in-process backend failed ({' '.join(command[:6])} ...):\n{done.stderr[-2000:]}"
        )
    partial.rename(target / LIBRARY)
    return target / LIBRARY


def _toolchain() -> tuple[str, str, Path]:
    from tpserve.server.triton.preloads import c_compiler

    compiler = c_compiler()
    if compiler is None:
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
    return compiler, include, _libpython(version)


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
