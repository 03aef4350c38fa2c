"""Debian packages fetched and unpacked inside the checkout, without root and without installing them.

`apt-get download` fetches .deb files with the host's package lists; where those are missing it reads lists
into a private folder first (an unprivileged `apt-get update`). `dpkg-deb -x` unpacks a package's files into
a folder of ours. Nothing is installed system-wide, no maintainer script runs, no service starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tpserve.common.errors import ToolError

APT_TIMEOUT_S = 300


def available() -> bool:
    """Whether apt-get and dpkg-deb are on PATH."""
    return bool(shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("apt-cache"))


def _run(tool: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"{tool} ran past {APT_TIMEOUT_S} s")


def _private_lists(scratch: Path) -> list[str]:
    """apt options that keep package lists and caches in scratch."""
    import pwd

    for sub in ("lists/partial", "cache/archives/partial"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    user = pwd.getpwuid(os.getuid()).pw_name
    return [
        *("-o", f"Dir::State::Lists={scratch / 'lists'}"),
        *("-o", f"Dir::Cache={scratch / 'cache'}"),
        *("-o", "Debug::NoLocking=1"),
        *("-o", f"APT::Sandbox::User={user}"),
    ]


def _tail(done: subprocess.CompletedProcess) -> str:
    return "\n".join((done.stdout + done.stderr).strip().splitlines()[-4:])


class Apt:
    """apt-get and apt-cache with the host's lists, or with lists of their own in scratch once those failed."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.options: list[str] = []

    def _private(self) -> bool:
        if self.options:
            return False
        self.options = _private_lists(self.scratch / "apt")
        return _run("apt-get", ["-q", *self.options, "update"], self.scratch).returncode == 0

    def _both(self, tool: str, args: list[str]) -> subprocess.CompletedProcess:
        done = _run(tool, ["-q", *self.options, *args], self.scratch)
        if done.returncode != 0 and self._private():
            done = _run(tool, ["-q", *self.options, *args], self.scratch)
        return done

    def download(self, packages: list[str]) -> list[Path]:
        """The .deb files of packages in scratch.

        Raises:
            ToolError: apt is missing or a package could not be fetched; the message quotes apt.
        """
        if not available():
            raise ToolError("apt-get, apt-cache or dpkg-deb not found: this host has no Debian package tools")
        done = self._both("apt-get", ["download", *packages])
        debs = [deb for p in packages for deb in sorted(self.scratch.glob(f"{p}_*.deb"))[:1]]
        if done.returncode != 0 or len(debs) != len(packages):
            raise ToolError(f"apt-get download {' '.join(packages)} failed (exit {done.returncode}):\n{_tail(done)}")
        return debs

    def depends(self, package: str) -> list[str]:
        """Every package that package needs, itself included (Depends and Pre-Depends, recursively)."""
        flags = ["--recurse", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces"]
        done = self._both("apt-cache", ["depends", *flags, "--no-enhances", package])
        if done.returncode != 0:
            raise ToolError(f"apt-cache depends {package} failed (exit {done.returncode}):\n{_tail(done)}")
        return sorted({line for line in done.stdout.splitlines() if line and not line.startswith((" ", "<"))})


def installed(package: str) -> bool:
    """Whether the host has package installed (dpkg's status)."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode == 0 and done.stdout.endswith("installed")


def unpack(deb: Path, tree: Path) -> None:
    """The package's files under tree (its own paths: tree/usr/bin/..., tree/usr/lib/...)."""
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True, timeout=APT_TIMEOUT_S)
