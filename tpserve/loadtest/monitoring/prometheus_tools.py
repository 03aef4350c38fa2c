"""Find or unpack Prometheus (prometheus + promtool) inside the checkout, without root.

`python -m tpserve.loadtest install-prometheus` fetches Debian's `prometheus` package (common.debian_packages: no
root, no install) and copies only its two binaries into .tools/prometheus/bin. Nothing is installed
system-wide and no service is started. Lookup order: $PROMETHEUS_BINARY, .tools/prometheus/bin, PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError, ToolError
from tpserve.paths import TOOLS

TOOLS_DIR = TOOLS / "prometheus"
PACKAGE = "prometheus"
BINARIES = ("prometheus", "promtool")


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


def _download(scratch: Path) -> Path:
    """Debian's prometheus .deb in scratch (common.debian_packages: the host's lists, else private ones)."""
    from tpserve.common.debian_packages import Apt

    try:
        return Apt(scratch).download([PACKAGE])[0]
    except ToolError as err:
        raise MeasurementError(f"{err}\nput a Prometheus release's binaries on PATH or set PROMETHEUS_BINARY") from err


def _unpack(deb: Path, scratch: Path) -> None:
    """Copy the package's binaries into TOOLS_DIR/bin (written beside, then renamed: never half a binary)."""
    from tpserve.common.debian_packages import unpack

    tree = scratch / "tree"
    unpack(deb, tree)
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
