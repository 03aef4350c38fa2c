"""tritonserver as another tool starts it: the embedded binary with what `server start` gives it (its backends
with the Python stub of this interpreter, the libraries, this Python environment for model.py, the response cache,
kernel caches in a folder of ours), and every argument the tool passes. Model Analyzer's `--triton-server-path`
takes the checkout's `bin/tritonserver`, which runs this (`bin/perf_analyzer`: loadtest/perf/tools.py).

What it does not add: the admin key and the edge. The tool that starts it loads and unloads models itself (Model
Analyzer's explicit model control), so it is its server, for its run. Its addresses default to 127.0.0.1 where
the tool names none (tritonserver's own default is every interface).
"""

from __future__ import annotations

import os
from pathlib import Path

from tpserve.paths import TOOLS

HOME = TOOLS / "tritonserver-standalone"  # backends and caches: this user's, 0700 (code is loaded from there)
ADDRESSES = ("--http-address", "--grpc-address", "--metrics-address")


def command(args: list[str], home: Path = HOME) -> tuple[list[str], dict]:
    """The command line and environment of the embedded tritonserver, given another tool's arguments.

    Raises:
        ServerError: no tritonserver installed, or home is not a private folder of this user.
    """
    from tpserve.common.errors import ServerError
    from tpserve.server.triton.inprocess_build import build_inprocess, uses_inprocess
    from tpserve.server.triton.installed import find_install, prepare_backends, server_environment
    from tpserve.server.triton.launcher import CACHE_BYTES, private_state
    from tpserve.triton_models.runtime.private_dirs import UnsafeFolderError, kernel_cache_env

    install = find_install()
    private_state(home)
    backends = prepare_backends(install, home)
    repo = _given(args, "--model-repository")
    if repo and uses_inprocess(Path(repo)):
        build_inprocess(backends)
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    line = [str(install.binary), *args]
    if "--backend-directory" not in given:
        line.append(f"--backend-directory={backends.resolve()}")
    line += [f"{flag}=127.0.0.1" for flag in ADDRESSES if flag not in given]
    if "--cache-config" not in given:
        line += [f"--cache-directory={install.caches}", f"--cache-config=local,size={CACHE_BYTES}"]
    try:
        env = {**server_environment(install), **kernel_cache_env(home)}
    except UnsafeFolderError as err:
        raise ServerError(str(err)) from None
    return line, env


def _given(args: list[str], flag: str) -> str | None:
    """A flag's value, given as --flag=value or --flag value."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def exec_tritonserver(args: list[str]) -> None:
    """Become the embedded tritonserver (never returns)."""
    os.umask(0o077)
    line, env = command(args)
    os.execve(line[0], line, env)
