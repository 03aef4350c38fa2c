"""The shim runs only in the tritonserver it was tested with (server/triton/triton_shim.c, check_server_version):
another
server API version stops the process before main() with a message naming both and the override. The real
tritonserver of the wheel is used; a shim built as if tested with other versions stands in for a newer server."""

import subprocess

import pytest

from tpserve.common.native_build import c_compiler
from tpserve.server.triton.installed import find_install, server_environment
from tpserve.server.triton.preloads import SOURCES


def _help(shim, **extra) -> subprocess.CompletedProcess:
    """tritonserver --help with the shim preloaded: main() prints the usage, or the shim stopped it first."""
    install = find_install()
    env = {**server_environment(install), "LD_PRELOAD": str(shim), **extra}
    if "TRITON_SHIM_ACCEPT_API" not in extra:
        env.pop("TRITON_SHIM_ACCEPT_API", None)
    return subprocess.run([str(install.binary), "--help"], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def untested_shim(tmp_path_factory):
    """The shim built as though it had been tested with server APIs 1.0 and 9.9 only."""
    compiler = c_compiler()
    if compiler is None:
        pytest.skip("no C compiler here")
    out = tmp_path_factory.mktemp("shim") / "libtriton_shim.so"
    command = [compiler, "-shared", "-fPIC", "-O2", "-Wall", '-DTESTED_API="1.0 9.9"', "-o", str(out)]
    subprocess.run([*command, *map(str, SOURCES), "-ldl"], check=True, capture_output=True, timeout=120)
    return out


def test_the_shim_runs_in_the_tritonserver_it_was_tested_with(shim):
    done = _help(shim)
    assert "Usage: tritonserver" in done.stdout + done.stderr and "refusing" not in done.stderr


def test_another_server_api_is_refused_with_both_versions_and_the_override_named(untested_shim):
    done = _help(untested_shim)
    assert done.returncode == 78 and "Usage" not in done.stdout, "main() must not run"
    message = done.stderr
    assert "its server API is 1.34" in message and "tested with tritonserver 2.51 (server API 1.0 9.9)" in message
    assert "TRITON_SHIM_ACCEPT_API=1.34" in message


def test_the_override_accepts_that_version_only(untested_shim):
    accepted = _help(untested_shim, TRITON_SHIM_ACCEPT_API="1.34")
    assert "Usage: tritonserver" in accepted.stdout + accepted.stderr
    assert "accepted by TRITON_SHIM_ACCEPT_API=1.34" in accepted.stderr
    assert _help(untested_shim, TRITON_SHIM_ACCEPT_API="1.3").returncode == 78  # not a prefix match
