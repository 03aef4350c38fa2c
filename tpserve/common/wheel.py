"""This project's own wheel, made from the checkout (for the offline bundle and the server image)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tpserve.paths import CHECKOUT


def project_wheel(dest: Path) -> None:
    """This project's wheel into dest; the build/ folder setuptools leaves in the checkout goes, unless it was there."""
    left = CHECKOUT / "build"
    existed = left.exists()
    try:
        pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(CHECKOUT)]
        subprocess.run(pip, check=True)
    finally:
        if not existed:
            shutil.rmtree(left, ignore_errors=True)
