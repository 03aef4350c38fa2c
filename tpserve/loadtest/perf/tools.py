"""Find or install a working perf_analyzer.

The binary inside the tritonclient 2.41.1 wheel runs on glibc >= 2.35 (Debian 12, Ubuntu
24.04) given libb64.so.0d and libcudart.so.12: the nvidia-pytriton wheel already ships both
(renamed by auditwheel), so .tools/perf_analyzer/lib holds links to them and nothing else is
downloaded. (The `perf-analyzer` name on the public index is a 2 KB placeholder, not a binary.)
$PERF_ANALYZER_HOME points at another such folder (the offline bundle's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError
from tpserve.paths import TOOLS

TOOLS_DIR = Path(os.environ.get("PERF_ANALYZER_HOME") or TOOLS / "perf_analyzer")
LEGACY_CLIENT = "tritonclient==2.41.1"
LIBRARIES = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}


@dataclass(frozen=True)
class PerfAnalyzer:
    """A perf_analyzer binary and the environment it runs in."""

    binary: Path
    env: dict

    def attempt(self, args: list[str], timeout: float, secret: str | None = None) -> subprocess.CompletedProcess:
        """Run perf_analyzer with args and return what it did, whatever its exit status. With a secret, the
        args carry its placeholder and the secret itself goes through a pipe (server/triton/preloads.py).

        Raises:
            MeasurementError: it ran past timeout (it was ended).
        """
        env = self.env
        fds: tuple[int, ...] = ()
        if secret is not None:
            from tpserve.server.triton.preloads import pass_secret

            env, fd = pass_secret(self.env, secret)
            fds = (fd,)
        try:
            return subprocess.run(
                [str(self.binary), *args], env=env, capture_output=True, text=True, timeout=timeout, pass_fds=fds
            )
        except subprocess.TimeoutExpired as err:
            raise MeasurementError(f"perf_analyzer ran past {timeout:.0f} s: {' '.join(args)}") from err
        finally:
            for fd in fds:
                os.close(fd)


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
        "no working perf_analyzer: run `make install` (or `python -m tpserve.loadtest install-perf-analyzer`), "
        "or point $PERF_ANALYZER at one"
    )


def perf_libraries(pytriton_libs: Path) -> dict[str, Path]:
    """perf_analyzer's library names -> pytriton's copies of them."""
    found = {}
    for wanted, pattern in LIBRARIES.items():
        matches = sorted(pytriton_libs.glob(pattern))
        if not matches:
            raise MeasurementError(f"{pattern} not found in {pytriton_libs}: reinstall nvidia-pytriton (make install)")
        found[wanted] = matches[0]
    return found


def _install_legacy_binary(scratch: Path) -> None:
    from tpserve.server.triton.installed import find_install

    step(f"perf_analyzer: fetching the binary of {LEGACY_CLIENT}")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "-q",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(scratch),
            LEGACY_CLIENT,
        ],
        check=True,
    )
    (TOOLS_DIR / "bin").mkdir(parents=True, exist_ok=True)
    (TOOLS_DIR / "lib").mkdir(parents=True, exist_ok=True)
    wheel = next(scratch.glob("tritonclient-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith("data/bin/perf_analyzer"))
        (TOOLS_DIR / "bin" / "perf_analyzer").write_bytes(archive.read(member))
    (TOOLS_DIR / "bin" / "perf_analyzer").chmod(0o755)
    for wanted, source in perf_libraries(find_install().libs).items():
        link = TOOLS_DIR / "lib" / wanted
        link.unlink(missing_ok=True)
        link.symlink_to(source)


def install_perf_analyzer() -> PerfAnalyzer:
    """Install a perf_analyzer that runs on this host (idempotent) and return it."""
    try:
        return find_perf_analyzer()
    except MeasurementError:
        pass
    with tempfile.TemporaryDirectory() as scratch:
        _install_legacy_binary(Path(scratch))
    return find_perf_analyzer()


def exec_perf_analyzer(args: list[str]) -> None:
    """Become the perf_analyzer found here, with its libraries (never returns): `bin/perf_analyzer`, for tools
    such as Model Analyzer (--perf-analyzer-path) that start perf_analyzer themselves."""
    found = find_perf_analyzer()
    os.execve(str(found.binary), [str(found.binary), *args], found.env)
