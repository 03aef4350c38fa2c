"""The launcher other tools start tritonserver with (bin/tritonserver): the tool's arguments pass unchanged, and
what `server start` sets up is added only where the tool gave none; addresses default to loopback."""

import os
import stat

import pytest

from tpserve.common.errors import ServerError
from tpserve.server.triton import standalone


def test_the_tools_arguments_pass_and_ours_fill_the_gaps(tmp_path):
    home = tmp_path / "home"
    line, env = standalone.command(["--model-repository=/r", "--http-port=9", "--grpc-address=0.0.0.0"], home)
    assert line[1:4] == ["--model-repository=/r", "--http-port=9", "--grpc-address=0.0.0.0"]
    assert "--http-address=127.0.0.1" in line and "--metrics-address=127.0.0.1" in line
    assert "--grpc-address=127.0.0.1" not in line, "an address the tool gives is its own"
    assert any(a.startswith("--backend-directory=") for a in line) and any(a.startswith("--cache-config") for a in line)
    assert (home / "backends" / "python" / "triton_python_backend_stub").exists()
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert "LD_LIBRARY_PATH" in env and "--admin" not in " ".join(line)
    given, _ = standalone.command(["--backend-directory=/b", "--cache-config=local,size=1"], home)
    assert sum(a.startswith("--backend-directory") for a in given) == 1 and "--cache-directory" not in " ".join(given)


def test_a_home_another_user_could_write_is_refused(tmp_path):
    home = tmp_path / "shared"
    home.mkdir(mode=0o777)
    os.chmod(home, 0o777)
    os.symlink(home, tmp_path / "link")
    with pytest.raises(ServerError):
        standalone.command([], tmp_path / "link")
