"""Find or unpack Prometheus (prometheus + promtool) inside the checkout, without root.

`python -m loadtest install-prometheus` fetches Debian's `prometheus` package with `apt-get download`
(no root needed; where the host's package lists are missing it reads them into a private folder) and
unpacks only its two binaries with `dpkg-deb -x` into .tools/prometheus/bin. Nothing is installed
system-wide and no service is started. Lookup order: $PROMETHEUS_BINARY, .tools/prometheus/bin, PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from common.cli import step
from common.errors import MeasurementError

TOOLS_DIR = Path(__file__).resolve().parents[2] / ".tools" / "prometheus"
PACKAGE = "prometheus"
BINARIES = ("prometheus", "promtool")
APT_TIMEOUT_S = 300


def _works(binary: Path) -> bool:
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and b"version" in done.stdout + done.stderr


def find_tool(name: str) -> Path | None:
    """prometheus or promtool: $PROMETHEUS_BINARY's folder, .tools/prometheus/bin, then PATH (None: absent)."""
    candidates = []
    if os.environ.get("PROMETHEUS_BINARY"):
        given = Path(os.environ["PROMETHEUS_BINARY"])
        candidates.append(given if name == "prometheus" else given.parent / name)
    candidates.append(TOOLS_DIR / "bin" / name)
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _apt(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        return subprocess.run(
            ["apt-get", "-q", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"apt-get ran past {APT_TIMEOUT_S} s")


def _private_lists(scratch: Path) -> list[str]:
    """apt options that keep package lists and caches in scratch (an unprivileged `apt-get update`)."""
    for sub in ("lists/partial", "cache/archives/partial"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    return [
        "-o",
        f"Dir::State::Lists={scratch / 'lists'}",
        "-o",
        f"Dir::Cache={scratch / 'cache'}",
        "-o",
        "Debug::NoLocking=1",
        "-o",
        "APT::Sandbox::User=" + _current_user(),
    ]


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _download(scratch: Path) -> Path:
    """Debian's prometheus .deb in scratch: the host's lists first, else lists read into scratch."""
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise MeasurementError(
            "apt-get/dpkg-deb not found: put a Prometheus release's binaries on PATH "
            "or set PROMETHEUS_BINARY (the Prometheus tests are skipped)"
        )
    done = _apt(["download", PACKAGE], scratch)
    if done.returncode != 0:
        options = _private_lists(scratch / "apt")
        updated = _apt([*options, "update"], scratch)
        done = _apt([*options, "download", PACKAGE], scratch) if updated.returncode == 0 else updated
    debs = sorted(scratch.glob(f"{PACKAGE}_*.deb"))
    if done.returncode != 0 or not debs:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-4:])
        raise MeasurementError(
            f"apt-get download {PACKAGE} failed (exit {done.returncode}):\n{tail}\n"
            "set PROMETHEUS_BINARY to a Prometheus binary instead"
        )
    return debs[0]


def _unpack(deb: Path, scratch: Path) -> None:
    """Copy the package's binaries into TOOLS_DIR/bin (written beside, then renamed: never half a binary)."""
    tree = scratch / "tree"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True, timeout=APT_TIMEOUT_S)
    (TOOLS_DIR / "bin").mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        partial = TOOLS_DIR / "bin" / f".{name}.partial"
        shutil.copyfile(tree / "usr" / "bin" / name, partial)
        partial.chmod(0o755)
        partial.replace(TOOLS_DIR / "bin" / name)


def install_prometheus() -> Path:
    """Prometheus in .tools/prometheus/bin (idempotent; one found elsewhere is used as it is).

    Raises:
        MeasurementError: no package could be fetched or unpacked; the message says what to do instead.
    """
    found = find_tool("prometheus")
    if found and _works(found) and find_tool("promtool"):
        return found
    step(f"prometheus: fetching Debian's {PACKAGE} package into {TOOLS_DIR} (no root, no service)")
    with tempfile.TemporaryDirectory(prefix="prometheus-") as scratch:
        _unpack(_download(Path(scratch)), Path(scratch))
    binary = TOOLS_DIR / "bin" / "prometheus"
    if not _works(binary):
        raise MeasurementError(f"{binary} does not run here; set PROMETHEUS_BINARY to one that does")
    return binary
