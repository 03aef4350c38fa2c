"""Installing the project into an environment that already has another supported torch keeps that torch: pip,
resolving our dependencies (ranges, pyproject.toml) in a fresh environment holding torch 2.11.0 and torchvision
0.26.0 beside the other dependencies at their pinned versions, installs the project alone and replaces nothing.
Offline: the environment's packages are metadata only (what pip's resolver reads), and the index is off."""

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from tpserve.loadtest.bundle import constraints

ROOT = Path(__file__).parents[2]
THEIRS = {"torch": "2.11.0", "torchvision": "0.26.0"}  # not the pins (2.14.1, 0.29.1): the user's own


def _fake_installed(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def test_installing_the_project_keeps_the_users_torch(tmp_path):
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = Path(
        subprocess.run(
            [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    ours = Path(sysconfig.get_paths()["purelib"])
    for tool in ("pip", "setuptools", "_distutils_hack", "pkg_resources"):  # to resolve and to read our metadata
        if not (ours / tool).exists():
            continue
        shutil.copytree(ours / tool, site / tool, symlinks=True)
    for info in [*ours.glob("pip-*.dist-info"), *ours.glob("setuptools-*.dist-info")]:
        shutil.copytree(info, site / info.name)
    pins = constraints()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        name = Requirement(text).name.lower()
        _fake_installed(site, name, THEIRS.get(name, pins[name]))
    report = tmp_path / "report.json"
    command = [str(env / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation"]
    done = subprocess.run(
        [*command, "--report", str(report), "-q", str(ROOT)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    installed = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installed == ["triton-pytorch-serving"], f"pip would also install or replace: {installed}"
