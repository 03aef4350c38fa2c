"""Users' own models from a spec file, end to end on a real tritonserver.

Four sources, each built from one spec file written here: a package made in this test (two
inputs of two dtypes with a named dynamic axis, two outputs, a checkpoint, INT8 with .npz
calibration), a torchvision model the zoo does not list (with labels, preprocessing and so its
image pipeline), a torch.export program, and an ONNX file. Each is served and compared with
the module's own outputs over HTTP and gRPC; perf_analyzer and Locust drive the two-input model
with inputs shaped by its spec; the torch runtime serves it from its torch.export program.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of
from tests.user_models import ACME, build_reference, write_package
from tpserve.builders.build import build_model, build_torch_variant
from tpserve.builders.repository.manifest import read_manifest
from tpserve.builders.repository.writer import TorchRuntime
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import spec_file
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.common.endpoints import Endpoint
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional

EXTRA = """
[[model]]
name = "mobilenet_small"
factory = "torchvision.models:mobilenet_v3_small"
factory_args = { num_classes = 4 }
max_batch_size = 4
inputs  = [ { name = "pixels", dtype = "FP32", dims = [3, 64, 64], image_format = "NCHW" } ]
outputs = [ { name = "scores", dtype = "FP32", dims = [4] } ]
labels = ["cat", "dog", "bird", "fish"]
preprocessing = { mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225] }
tolerances = { fp32 = [5e-4, 1e-3] }

[[model]]
name = "tiny_exported"
exported = "tiny.pt2"
max_batch_size = 8
inputs  = [ { name = "x", dtype = "FP32", dims = [6] } ]
outputs = [ { name = "y", dtype = "FP32", dims = [3] } ]

[[model]]
name = "tiny_onnx"
onnx = "tiny.onnx"
max_batch_size = 8
inputs  = [ { name = "x", dtype = "FP32", dims = [6] } ]
outputs = [ { name = "y", dtype = "FP32", dims = [3] } ]
"""


@dataclass
class UserServed:
    state: endpoints.ServerState
    repo: Path
    folder: Path
    modules: dict

    def endpoint(self, protocol: str) -> Endpoint:
        return endpoint_of(self.state, self.repo, protocol)


def _tiny(folder: Path):
    """A small module saved as a torch.export program and as an ONNX file (dynamic batch)."""
    import torch

    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 3)).eval()
    example = (torch.randn(2, 6),)
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(module, example, dynamic_shapes=({0: batch},))
    torch.export.save(program, str(folder / "tiny.pt2"))
    torch.onnx.export(
        module,
        example,
        str(folder / "tiny.onnx"),
        input_names=["x"],
        output_names=["y"],
        dynamic_shapes=({0: batch},),
        dynamo=True,
    )
    return module


def _calibration(folder: Path) -> None:
    rng = np.random.default_rng(3)
    np.savez(
        folder / "calib.npz",
        image=rng.standard_normal((32, 3, 16, 16)).astype(np.float32),
        ids=rng.integers(0, 50, (32, 12)).astype(np.int64),
    )


@pytest.fixture(scope="module")
def user_served(tmp_path_factory):
    from tpserve.builders.__main__ import _write_pipelines

    folder = write_package(tmp_path_factory.mktemp("acme_project"))
    tiny = _tiny(folder)
    _calibration(folder)
    acme = ACME + 'precisions = ["fp32", "int8"]\ncalibration = "calib.npz"\n'
    (folder / "models.toml").write_text(acme + EXTRA)
    repo, work = folder / "repo", folder / "build"
    for user in spec_file.load(folder / "models.toml"):
        request = BuildRequest(
            spec=user.spec,
            target="embedded",
            repo=repo,
            work_dir=work,
            options=user.serving,
            precisions=user.precisions,
            calibration=user.calibration,
        )
        build_model(request)
        if user.pipelines:
            _write_pipelines(repo, user.spec, user.serving)
    acme_spec = spec_file.load(folder / "models.toml")[0].spec
    build_torch_variant(
        BuildRequest(spec=acme_spec, target="embedded", repo=repo, work_dir=work), TorchRuntime(precision="fp32")
    )
    modules = {"acme_classifier": build_reference(folder), "tiny_exported": tiny, "tiny_onnx": tiny}
    with launcher.running(repo, folder / "state") as state:
        yield UserServed(state, repo, folder, modules)


def _acme_inputs(batch: int, length: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.standard_normal((batch, 3, 16, 16)).astype(np.float32),
        "ids": rng.integers(0, 50, (batch, length)).astype(np.int64),
    }


def _torch_outputs(module, arrays: dict) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out = module(*[torch.from_numpy(a) for a in arrays.values()])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def test_every_model_of_the_spec_file_is_built_and_recorded(user_served):
    models = read_manifest(user_served.repo)["models"]
    assert {
        "acme_classifier",
        "acme_classifier_int8",
        "mobilenet_small",
        "tiny_exported",
        "tiny_onnx",
        "acme_classifier_torch_fp32",
    } <= set(models)
    assert models["acme_classifier"]["validation"]["passed"]
    assert models["acme_classifier"]["spec"]["builder"] == "user_factory"
    assert models["acme_classifier_int8"]["int8"]["calibration_samples"] == 32
    assert (user_served.repo / "mobilenet_small_pipeline" / "config.pbtxt").exists()
    assert not (user_served.repo / "acme_classifier_pipeline").exists()  # two inputs: no image pipeline


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["acme_classifier", "acme_classifier_torch_fp32"])
def test_the_two_input_model_serves_the_modules_numbers(user_served, protocol, model):
    ep = user_served.endpoint(protocol)
    with ep.client() as client:
        for batch, length in ((1, 1), (3, 9), (8, 24)):
            arrays = _acme_inputs(batch, length, seed=batch)
            got = infer(ep, model, arrays, client=client).outputs
            want = _torch_outputs(user_served.modules["acme_classifier"], arrays)
            np.testing.assert_allclose(got["logits"], want[0], atol=1e-4, rtol=1e-3)
            np.testing.assert_allclose(got["embedding"], want[1], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["tiny_exported", "tiny_onnx"])
def test_exported_and_onnx_models_serve_the_modules_numbers(user_served, protocol, model):
    x = np.random.default_rng(5).standard_normal((5, 6)).astype(np.float32)
    got = infer(user_served.endpoint(protocol), model, {"x": x}).outputs["y"]
    np.testing.assert_allclose(got, _torch_outputs(user_served.modules[model], {"x": x})[0], atol=1e-5, rtol=1e-4)


def test_the_torchvision_model_and_its_pipeline_serve(user_served):
    import io

    from PIL import Image

    ep = user_served.endpoint("grpc")
    x = np.random.default_rng(2).standard_normal((2, 3, 64, 64)).astype(np.float32)
    result = infer(ep, "mobilenet_small", {"pixels": x}, top_k=2)
    assert [len(r) for r in result.top_k] == [2, 2] and {r[0][2] for r in result.top_k} <= {
        "cat",
        "dog",
        "bird",
        "fish",
    }
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((80, 80, 3), np.uint8)).save(buffer, format="PNG")
    out = infer(ep, "mobilenet_small_pipeline", {"IMAGE": np.array([[buffer.getvalue()]], dtype=object)}).outputs
    assert all(v.shape[0] == 1 for v in out.values())


def test_perf_analyzer_drives_the_two_input_model_with_spec_shaped_inputs(user_served, tmp_path):
    import json

    from tpserve.clients.served import served_spec
    from tpserve.loadtest.perf import sweep as perf
    from tpserve.loadtest.perf.tools import find_perf_analyzer

    ep = user_served.endpoint("grpc")
    spec = served_spec(ep.repo, "acme_classifier")
    data = perf.input_data_file(ep, "acme_classifier", tmp_path / "input.json", spec=spec)
    sample = json.loads(data.read_text())["data"][0]
    assert sample["ids"]["shape"] == [8] and max(sample["ids"]["content"]) < 50  # spec's length and vocabulary
    # A functional check, not a measurement: loose stability so that a busy host cannot fail it (it did once).
    sweep = perf.Sweep(
        "acme_classifier",
        protocol="grpc",
        concurrency=(2,),
        batch_sizes=(1, 4),
        measurement_ms=500,
        max_trials=10,
        stability_percent=100,
        input_data=data,
    )
    rows = perf.run_sweep(sweep, ep, find_perf_analyzer(), tmp_path / "raw")
    assert [r["batch"] for r in rows] == [1, 4] and all(r["throughput"] > 0 for r in rows)


def test_the_manifest_gives_the_default_model_list(user_served):
    from tpserve.clients.served import served_models, variants_of

    names = served_models(user_served.endpoint("http"))
    assert names[0] == "acme_classifier" and {"tiny_onnx", "mobilenet_small"} <= set(names)
    assert variants_of(user_served.repo, "acme_classifier") == [
        "acme_classifier",
        "acme_classifier_int8",
        "acme_classifier_torch_fp32",
    ]


def test_locust_drives_the_two_input_model(user_served, tmp_path):
    from tpserve.loadtest.locust_suite.run import LocustRun, run_locust

    run = LocustRun(models=(("acme_classifier", 1),), protocol="grpc", users=2, spawn_rate=2, run_time_s=4)
    result = run_locust(run, user_served.state, tmp_path)
    row = next(r for r in result.rows if r["name"].startswith("acme_classifier"))
    assert row["requests"] > 0 and row["failures"] == 0 and result.exit_code == 0
