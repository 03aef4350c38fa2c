"""Launcher failures with a real tritonserver: a model that cannot load, a port already held."""

import shutil

import pytest

from tests.conftest import free_port
from tpserve.common.errors import ServerError
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional


def test_a_model_that_fails_to_load_is_named_with_its_reason(served, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(served.repo / "digits_cnn", repo / "digits_cnn")
    (repo / "digits_cnn" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    settings = launcher.ServerSettings(
        repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), state_dir=tmp_path / "state"
    )
    with pytest.raises(ServerError, match=r"model\(s\) failed to load: digits_cnn: .*(onnx|ONNX|protobuf|INVALID)"):
        launcher.start(settings)
    assert launcher.stop(settings.state_dir) is False  # the failed start already stopped it


def test_a_second_server_on_the_same_ports_is_refused(served, tmp_path):
    state = served.state
    settings = launcher.ServerSettings(
        served.repo,
        http_port=state.http_port,
        grpc_port=state.grpc_port,
        metrics_port=state.metrics_port,
        state_dir=tmp_path / "state",
    )
    with pytest.raises(ServerError, match=f"http port {state.http_port} on 127.0.0.1 is in use"):
        launcher.start(settings)


def test_a_second_server_from_the_same_state_dir_is_refused_and_the_first_keeps_serving(served, tmp_path):
    """Other ports, the same STATE_DIR: refused before anything starts (a second stack would overwrite the first's
    records, and `make stop` would then stop only one of them), naming the running one and how to stop it; the
    first still serves, and its records are untouched. Through the edge (serve's default) as well."""
    import os

    from tpserve.common import endpoints
    from tpserve.server.single import SingleSettings, start_single

    folder = served.state_dir
    before = (folder / endpoints.STATE).read_text()
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    settings = launcher.ServerSettings(served.repo, **ports, state_dir=folder)
    with pytest.raises(ServerError, match=rf"a server started from {folder} is running \(tritonserver pid \d+"):
        launcher.start(settings)
    edge = SingleSettings(
        served.repo,
        **{k: v for k, v in ports.items() if k != "metrics_port"},
        metrics_port=free_port(),
        state_dir=folder,
    )
    with pytest.raises(ServerError, match="make stop STATE_DIR="):
        start_single(edge)
    assert (folder / endpoints.STATE).read_text() == before
    os.kill(endpoints.read_state(folder).pid, 0)  # still there


def test_status_lists_the_loaded_models_with_version_and_state(served):
    from click.testing import CliRunner

    from tpserve.server.__main__ import cli

    said = CliRunner().invoke(cli, ["status", "--state-dir", str(served.state_dir)])
    assert said.exit_code == 0, said.output
    assert "models: " in said.output and "digits_cnn v1 READY" in said.output
