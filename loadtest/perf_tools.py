"""Find or install a working perf_analyzer.

Where glibc >= 2.38 (Ubuntu 24.04) the `perf-analyzer` wheel works. On older glibc
(Debian 12) the binary inside the tritonclient 2.41.1 wheel does, given libb64.so.0d
(Debian's libb64-0d) and libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel); both are
unpacked next to it under .tools/perf_analyzer, so no root install is needed.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from builders.cli_support import step
from builders.errors import MeasurementError

TOOLS_DIR = Path(__file__).resolve().parent.parent / ".tools" / "perf_analyzer"
LEGACY_CLIENT = "tritonclient==2.41.1"
CUDART = "nvidia-cuda-runtime-cu12==12.9.79"


@dataclass(frozen=True)
class PerfAnalyzer:
    """A perf_analyzer binary and the environment it runs in."""

    binary: Path
    env: dict

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run perf_analyzer with args; raise MeasurementError on failure, with its output."""
        try:
            done = subprocess.run([str(self.binary), *args], env=self.env, capture_output=True, text=True,
                                  timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired as err:
            raise MeasurementError(f"perf_analyzer ran past {timeout:.0f} s: {' '.join(args)}") from err
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise MeasurementError(f"perf_analyzer failed (exit {done.returncode}):\n{tail}")
        return done


def _glibc() -> tuple[int, int]:
    name, version = platform.libc_ver()
    if name != "glibc":
        return (0, 0)
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _works(binary: Path, env: dict) -> bool:
    try:
        done = subprocess.run([str(binary), "--help"], env=env, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"concurrency-range" in done.stdout + done.stderr


def _local_install() -> PerfAnalyzer:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(TOOLS_DIR / "lib"), env.get("LD_LIBRARY_PATH")) if p)
    return PerfAnalyzer(TOOLS_DIR / "bin" / "perf_analyzer", env)


def _candidates() -> list[PerfAnalyzer]:
    found = []
    if os.environ.get("PERF_ANALYZER"):
        found.append(PerfAnalyzer(Path(os.environ["PERF_ANALYZER"]), dict(os.environ)))
    found.append(_local_install())
    on_path = shutil.which(
        "perf_analyzer", path=os.pathsep.join((str(Path(sys.executable).parent), os.environ["PATH"]))
    )
    if on_path:
        found.append(PerfAnalyzer(Path(on_path), dict(os.environ)))
    return found


def find_perf_analyzer() -> PerfAnalyzer:
    """The first perf_analyzer that runs here ($PERF_ANALYZER, .tools, then PATH).

    Raises:
        MeasurementError: none runs; the message says how to install one.
    """
    for candidate in _candidates():
        if candidate.binary.exists() and _works(candidate.binary, candidate.env):
            return candidate
    raise MeasurementError(
        "no working perf_analyzer: run `make install` (or `python -m loadtest install-perf-analyzer`), "
        "or point $PERF_ANALYZER at one"
    )


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def _install_from_legacy_wheel(scratch: Path) -> None:
    step(f"perf_analyzer: fetching the binary of {LEGACY_CLIENT} and libcudart from {CUDART}")
    _pip("download", "--no-deps", "--only-binary=:all:", "-d", str(scratch), LEGACY_CLIENT, CUDART)
    (TOOLS_DIR / "bin").mkdir(parents=True, exist_ok=True)
    (TOOLS_DIR / "lib").mkdir(parents=True, exist_ok=True)
    _extract(scratch, "tritonclient-*.whl", "data/bin/perf_analyzer", TOOLS_DIR / "bin" / "perf_analyzer")
    _extract(scratch, "nvidia_cuda_runtime*.whl", "lib/libcudart.so.12", TOOLS_DIR / "lib" / "libcudart.so.12")
    (TOOLS_DIR / "bin" / "perf_analyzer").chmod(0o755)
    _install_libb64(scratch)


def _extract(folder: Path, pattern: str, suffix: str, dest: Path) -> None:
    wheel = next(folder.glob(pattern))
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(suffix))
        dest.write_bytes(archive.read(member))


def _install_libb64(scratch: Path) -> None:
    step("perf_analyzer: fetching libb64.so.0d (Debian package libb64-0d)")
    download = ["apt-get", "download", "libb64-0d"]
    if subprocess.run(download, cwd=scratch, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        subprocess.run(download, cwd=scratch, check=True, capture_output=True)
    unpacked = scratch / "deb"
    subprocess.run(["dpkg", "-x", str(next(scratch.glob("libb64-0d_*.deb"))), str(unpacked)], check=True)
    for lib in unpacked.rglob("libb64.so.0d*"):
        shutil.copy2(lib, TOOLS_DIR / "lib" / lib.name)


def install_perf_analyzer() -> PerfAnalyzer:
    """Install a perf_analyzer that runs on this host (idempotent) and return it."""
    try:
        return find_perf_analyzer()
    except MeasurementError:
        pass
    if _glibc() >= (2, 38):
        step("perf_analyzer: installing the perf-analyzer wheel (glibc >= 2.38)")
        _pip("install", "perf-analyzer")
    else:
        with tempfile.TemporaryDirectory() as scratch:
            _install_from_legacy_wheel(Path(scratch))
    return find_perf_analyzer()
