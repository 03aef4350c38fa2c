"""Zero-downtime rollouts into a supervised server, under a 2-thread load on HTTP and gRPC.

Builds: the served digits_cnn; a new build whose logits are the served ones + 1 (same accuracy, so
the test can tell which version answered); a build that answers wrongly (last layer's rows rotated,
its true accuracy recorded); a build whose artifact is corrupt; a build that changes the interface.
"""

import copy
import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of
from tests.functional.load import ClosedLoop
from tpserve.builders.build import build_model
from tpserve.builders.repository.manifest import read_manifest
from tpserve.builders.repository.writer import ServingOptions
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec.zoo import BuiltModel, digits
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.operations.rollout import RolloutError, RolloutRequest, rollout
from tpserve.server.supervision.rollout_lock import rollout_lock
from tpserve.server.supervision.supervisor_process import start_supervised, stop_supervisor
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional
X = np.random.default_rng(3).standard_normal((2, 1, 8, 8)).astype(np.float32)


def _variant(built: BuiltModel, change) -> BuiltModel:
    """A copy of the module with its last layer changed, and its accuracy measured anew."""
    import torch

    module = copy.deepcopy(built.module)
    with torch.no_grad():
        change(module[-1])
    x, y = built.sample_data["x"], built.sample_data["y"]
    return BuiltModel(module.eval(), {**built.metrics, "accuracy": digits.evaluate(module, x, y)}, built.sample_data)


def _shift_logits(layer):
    layer.bias += 1.0


def _rotate_classes(layer):
    layer.weight.copy_(layer.weight.roll(1, 0))
    layer.bias.copy_(layer.bias.roll(1, 0))


@pytest.fixture(scope="module")
def builds(digits_build, tmp_path_factory):
    """name -> repository holding a build of digits_cnn."""
    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("rollout_builds")
    variants = {"served": built, "shifted": _variant(built, _shift_logits), "wrong": _variant(built, _rotate_classes)}
    repos = {}
    for name, module in variants.items():
        repos[name] = root / name
        build_model(
            BuildRequest(
                spec=spec, target="embedded", repo=repos[name], work_dir=root / f"work_{name}", options=ServingOptions()
            ),
            module,
        )
    repos["corrupt"] = _copy_with(root, repos["shifted"], "corrupt", "1/model.onnx", b"not an onnx model")
    config = (repos["shifted"] / "digits_cnn" / "config.pbtxt").read_text()
    repos["interface"] = _copy_with(
        root, repos["shifted"], "interface", "config.pbtxt", config.replace("dims: 10", "dims: 11").encode()
    )
    return repos


def _copy_with(root, source, name, relative, data: bytes):
    target = root / name
    shutil.copytree(source, target)
    (target / "digits_cnn" / relative).write_bytes(data)
    return target


@pytest.fixture(scope="module")
def server(builds, tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout_server")
    shutil.copytree(builds["served"], root / "repo")
    http_port, grpc_port, metrics_port, health_port = endpoints.free_ports(4)
    settings = launcher.ServerSettings(
        root / "repo", http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, state_dir=root / "state"
    )
    start_supervised(settings, health_port)
    yield settings
    stop_supervisor(settings.state_dir)
    launcher.stop(settings.state_dir)


class Load(ClosedLoop):
    """One closed-loop client per protocol sending to digits_cnn (no version: what the server serves)."""

    def __init__(self, settings):
        state = endpoints.read_state(settings.state_dir)
        super().__init__([endpoint_of(state, settings.repo, p) for p in ("http", "grpc")], "digits_cnn", {"input": X})

    def assert_no_failures(self):
        for protocol, (requests, failed) in sorted(self.counts().items()):
            print(f"{protocol}: {requests} requests, {failed} failed")
            assert requests > 20, f"{protocol}: the load sent only {requests} requests"
        assert not self.failures(), self.failures()[:3]


def _logits(settings, version: str = "") -> np.ndarray:
    ep = endpoint_of(endpoints.read_state(settings.state_dir), settings.repo, "grpc")
    return next(iter(infer(ep, "digits_cnn", {"input": X}, version=version).outputs.values()))


def _ready_versions(settings) -> list[str]:
    ep = endpoint_of(endpoints.read_state(settings.state_dir), settings.repo, "http")
    with ep.client() as client:
        index = client.get_model_repository_index(headers=ep.admin_headers)
    return [m["version"] for m in index if m["name"] == "digits_cnn" and m.get("state") == "READY"]


def _history(settings) -> list[dict]:
    return read_manifest(settings.repo)["models"]["digits_cnn"]["history"]


def _served_version(settings) -> int:
    return int(max(_ready_versions(settings), key=int))


def test_a_good_build_rolls_in_without_a_failed_request(server, builds):
    before, serving = _logits(server), _served_version(server)
    with Load(server) as load:
        event = rollout(RolloutRequest(model="digits_cnn", source=builds["shifted"], state_dir=server.state_dir))
    load.assert_no_failures()
    assert event["version"] == serving + 1 and event["previous"] == serving
    assert _ready_versions(server) == [str(serving + 1)], "the old version was not retired"
    np.testing.assert_allclose(_logits(server), before + 1.0, atol=1e-4)  # the new build answers
    assert event["checks"]["smoke"] == "passed" and event["checks"]["accuracy"] > 0.9
    history = _history(server)
    assert [h["status"] for h in history][-2:] == ["retired", "serving"]
    assert history[-1]["source"] == str(builds["shifted"].resolve())
    entry = read_manifest(server.repo)["models"]["digits_cnn"]
    assert entry["served_version"] == serving + 1 and entry["artifact"] == f"digits_cnn/{serving + 1}/model.onnx"
    assert not (server.repo / "digits_cnn__candidate").exists()
    assert not list(server.repo.glob(".staging-*")) and not list(server.repo.glob("digits_cnn/.*"))


def test_a_build_that_answers_wrongly_is_rejected_before_it_takes_traffic(server, builds):
    serving, before = _served_version(server), _logits(server)
    with Load(server) as load:
        with pytest.raises(RolloutError, match=r"rejected: served accuracy 0\.\d+ is .* below the serving version"):
            rollout(RolloutRequest(model="digits_cnn", source=builds["wrong"], state_dir=server.state_dir))
    load.assert_no_failures()
    assert _ready_versions(server) == [str(serving)]
    np.testing.assert_allclose(_logits(server), before, atol=1e-5)
    assert _history(server)[-1]["status"] == "rejected" and "accuracy" in _history(server)[-1]["reason"]
    assert not (server.repo / "digits_cnn__candidate").exists()
    assert not (server.repo / "digits_cnn" / str(serving + 1)).exists()


def test_without_the_canary_a_wrong_build_is_rolled_back(server, builds):
    serving, before = _served_version(server), _logits(server)
    with Load(server) as load:
        with pytest.raises(RolloutError, match="rolled back: served accuracy"):
            rollout(
                RolloutRequest(model="digits_cnn", source=builds["wrong"], state_dir=server.state_dir, canary=False)
            )
    load.assert_no_failures()  # the wrong version answered for a moment: wrongly, but without an error
    _await(lambda: _ready_versions(server) == [str(serving)])
    np.testing.assert_allclose(_logits(server), before, atol=1e-5)
    assert _history(server)[-1]["status"] == "rolled back"
    assert sorted(p.name for p in (server.repo / "digits_cnn").iterdir() if p.name.isdigit())[-1] == str(serving)


def test_a_corrupt_build_is_rejected_with_the_servers_reason_and_the_cli_exits_non_zero(server, builds):
    serving = _served_version(server)
    with Load(server) as load:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tpserve.operations",
                "rollout",
                "--model",
                "digits_cnn",
                "--from",
                str(builds["corrupt"]),
                "--state-dir",
                str(server.state_dir),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    load.assert_no_failures()
    assert done.returncode != 0
    assert "rejected: loading digits_cnn__candidate failed" in done.stderr, done.stderr
    assert _ready_versions(server) == [str(serving)]


def test_refusals_before_anything_changes(server, builds, tmp_path):
    files = sorted(str(p) for p in server.repo.rglob("*"))
    with pytest.raises(RolloutError, match="changes the model's interface"):
        rollout(RolloutRequest(model="digits_cnn", source=builds["interface"], state_dir=server.state_dir))
    with pytest.raises(RolloutError, match="not in the served repository"):
        shutil.copytree(builds["shifted"] / "digits_cnn", tmp_path / "other" / "digits_cnn_b")
        (tmp_path / "other" / "manifest.json").write_text(json.dumps({"models": {"digits_cnn_b": {}}}))
        rollout(RolloutRequest(model="digits_cnn_b", source=tmp_path / "other", state_dir=server.state_dir))
    with pytest.raises(RolloutError, match="make build-engines MODELS=digits_cnn REPO="):
        rollout(RolloutRequest(model="digits_cnn", source=tmp_path / "missing", state_dir=server.state_dir))
    with rollout_lock(server.state_dir, ["digits_cnn"]):
        with pytest.raises(Exception, match="another rollout"):
            rollout(RolloutRequest(model="digits_cnn", source=builds["shifted"], state_dir=server.state_dir))
    assert sorted(str(p) for p in server.repo.rglob("*")) == files


def _await(condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)
