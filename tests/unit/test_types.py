"""mypy runs in `make lint` over every package with pyproject's settings; those settings catch a type error (a
scratch copy of a package with one added fails, the same copy without it passes)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
BROKEN = '\n\ndef broken_on_purpose() -> int:\n    return "not an int"\n'


def _mypy(folder: Path, target: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", ".cache"]
    return subprocess.run([*command, target], cwd=folder, capture_output=True, text=True, timeout=300)


def test_lint_runs_the_type_checker_over_every_package():
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "-m mypy" in recipe
    import tomllib

    checked = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py") if not p.parent.is_symlink()} - {"tests"}
    assert set(checked) == packages, "a package mypy does not check, or one it names that is gone"


def test_a_deliberate_type_error_fails_the_check(tmp_path):
    shutil.copytree(ROOT / "tpserve" / "common", tmp_path / "common", ignore=shutil.ignore_patterns("__pycache__"))
    clean = _mypy(tmp_path, "common")
    assert clean.returncode == 0, clean.stdout
    with open(tmp_path / "common" / "errors.py", "a") as handle:
        handle.write(BROKEN)
    broken = _mypy(tmp_path, "common")
    assert broken.returncode == 1 and "common/errors.py" in broken.stdout and "[return-value]" in broken.stdout
