"""A GPU host with numpy 2, as the offline bundle's install.sh leaves it: the stubs run in their own environment
(TPSERVE_STUB_PYTHON, numpy 1 over the host's packages), so a default build of an image model is served whole:
the ONNX Runtime model and its image pipelines (their BYTES steps) answer, and nothing is left out."""

import os

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: run on a GPU host"),
    pytest.mark.skipif(np.__version__.startswith("1."), reason="numpy 1 here: stubs need none"),
    pytest.mark.skipif(  # under the bundle (its install.sh sets PERF_ANALYZER_HOME), a missing stub-env fails
        not os.environ.get("TPSERVE_STUB_PYTHON") and not os.environ.get("PERF_ANALYZER_HOME"),
        reason='not installed from the offline bundle: run after eval "$(sh triton-bundle/install.sh)"',
    ),
]

from tpserve.builders.build import build_model  # noqa: E402
from tpserve.builders.repository.pipelines import write_image_pipelines  # noqa: E402
from tpserve.builders.request import BuildRequest  # noqa: E402
from tpserve.builders.spec import zoo  # noqa: E402
from tpserve.clients.infer import infer  # noqa: E402
from tpserve.server.triton import launcher  # noqa: E402


def test_the_stubs_own_numpy_serves_every_model_of_a_default_build(tmp_path):
    assert os.environ.get("TPSERVE_STUB_PYTHON"), "the bundle's install.sh made no stub-env on this numpy 2 host"
    spec = zoo.get_spec("resnet18", image_size=64, max_batch_size=8)
    built = zoo.build_module(spec)
    repo = tmp_path / "repo"
    build_model(BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=tmp_path / "work"), built)
    write_image_pipelines(repo, spec, top_k=3)
    pixels = np.random.default_rng().integers(0, 256, (4, 64, 64, 3)).astype(np.uint8)
    with launcher.running(repo, tmp_path / "state") as state:
        assert state.left_out == {}
        for protocol in ("http", "grpc"):
            out = infer(state.endpoint(protocol), f"{spec.name}_pipeline_u8", {"IMAGE": pixels}).outputs
            assert out["CLASS_IDS"].shape == (4, 3)
            assert all(label for label in out["LABELS"][:, 0])
