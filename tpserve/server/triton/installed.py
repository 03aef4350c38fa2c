"""Where the tritonserver of the nvidia-pytriton wheel lives, and a backend folder it can use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tpserve.common.errors import ServerError


@dataclass(frozen=True)
class TritonInstall:
    """The pieces of the wheel's Triton: binary, Python backend, stubs, libraries, caches."""

    root: Path
    libs: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    def stub(self, python_version: str) -> Path:
        return self.root / "python_backend_stubs" / python_version / "triton_python_backend_stub"


def find_install() -> TritonInstall:
    """Locate the tritonserver shipped in the nvidia-pytriton wheel.

    Raises:
        ServerError: the wheel is not installed or its binary is missing.
    """
    import importlib.util

    found = importlib.util.find_spec("pytriton")  # located, not imported: its own deps are not needed
    if found is None or found.origin is None:
        raise ServerError(
            "tritonserver not found: the nvidia-pytriton wheel is not installed in this environment; "
            "run `make install` (it installs nvidia-pytriton==0.7.0), or use the offline bundle (make bundle)"
        )
    root = Path(found.origin).parent / "tritonserver"
    install = TritonInstall(root, root.parent.parent / "nvidia_pytriton.libs")
    if not install.binary.exists():
        raise ServerError(f"tritonserver binary missing at {install.binary}; reinstall with `make install`")
    return install


def prepare_backends(install: TritonInstall, state_dir: Path) -> Path:
    """A backend folder whose Python backend carries the stub for the running interpreter."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = install.stub(version)
    if not stub.exists():
        raise ServerError(
            f"the nvidia-pytriton wheel has no Python-backend stub for Python {version} ({stub}); "
            "use Python 3.10 to 3.12"
        )
    backends = state_dir / "backends"
    target = backends / "python"
    if target.exists():
        shutil.rmtree(target)
    for source in install.python_backend.rglob("*"):  # files and folders take their modes from the umask
        if source.is_file() and "__pycache__" not in source.parts:
            (target / source.relative_to(install.python_backend)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / source.relative_to(install.python_backend))
    shutil.copyfile(stub, target / "triton_python_backend_stub")
    (target / "triton_python_backend_stub").chmod(0o755 & ~_umask())
    return backends


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def server_environment(install: TritonInstall) -> dict:
    """Environment for tritonserver: its libraries, libpython, and this Python environment for model.py."""
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(install.libs), libdir, env.get("LD_LIBRARY_PATH")) if p)
    # The stub's embedded interpreter ignores PYTHONPATH but takes its prefix from `python3` on
    # PATH: putting this interpreter's folder first gives model.py this environment (venv included), or the
    # stubs' own (TPSERVE_STUB_PYTHON: numpy 1 on a host with numpy 2).
    env["PATH"] = os.pathsep.join((str(stub_python().parent), env.get("PATH", "")))
    # tpserve itself comes from that environment (installed, or editable in a checkout): the checkout's own
    # folder is never put on the path, so a user's package named like one of ours (common, clients) stays theirs.
    return env


STUB_PYTHON = "TPSERVE_STUB_PYTHON"


def stub_python() -> Path:
    """The Python whose environment the Python-backend stubs run in: TPSERVE_STUB_PYTHON where it is set (the
    bundle's install.sh makes one with numpy 1 on a host with numpy 2: the stub was built for numpy 1), else this
    one.

    Raises:
        ServerError: TPSERVE_STUB_PYTHON names no Python, or one whose folder has no `python3` (the stub finds
            its environment through that name on PATH).
    """
    given = os.environ.get(STUB_PYTHON, "")
    if not given:
        return Path(sys.executable)
    path = Path(given)
    if not (path.parent / "python3").is_file() or not os.access(path, os.X_OK):
        raise ServerError(
            f"{STUB_PYTHON}={given}: no python3 there to run the Python-backend stubs in; make it with the bundle's "
            f"install.sh (its stub-env), or unset {STUB_PYTHON}"
        )
    return path


def stub_numpy() -> str:
    """The numpy version of the stubs' environment (stub_python)."""
    path = stub_python()
    if path == Path(sys.executable):
        import numpy

        return numpy.__version__
    done = subprocess.run(
        [str(path), "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ServerError(f"{STUB_PYTHON}={path}: its numpy does not import: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()
