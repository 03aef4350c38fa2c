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
