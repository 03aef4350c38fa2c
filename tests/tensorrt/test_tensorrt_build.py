"""TensorRT plans for real. Runs where `tensorrt` imports (the NGC TensorRT container); skipped elsewhere."""

import pytest

trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed here: run inside the NGC TensorRT container")

from tpserve.builders.build import build_model  # noqa: E402
from tpserve.builders.checks.guard import check_manifest, local_target  # noqa: E402
from tpserve.builders.formats.tensorrt_plans import build_plan_variant  # noqa: E402
from tpserve.builders.formats.tensorrt_profile import EngineOptions  # noqa: E402
from tpserve.builders.repository import manifest  # noqa: E402
from tpserve.builders.repository import writer as repository  # noqa: E402
from tpserve.builders.repository.model_config import parse_pbtxt  # noqa: E402
from tpserve.builders.request import BuildRequest  # noqa: E402

pytestmark = pytest.mark.tensorrt


@pytest.fixture(scope="module")
def built_repo(digits_build, tmp_path_factory):
    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("trt")
    build_model(BuildRequest(spec=spec, target="ngc", repo=root / "repo", work_dir=root / "work"), built)
    return spec, root


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_plans_build_compare_and_fit_this_host(built_repo, precision):
    spec, root = built_repo
    entry = build_plan_variant(
        spec, root / "repo", root / "work", EngineOptions(precision=precision), repository.ServingOptions()
    )
    assert entry["validation"]["passed"] and entry["timing"]["throughput_qps"] > 0
    config = parse_pbtxt((root / "repo" / entry["name"] / "config.pbtxt").read_text())
    assert config.platform == "tensorrt_plan" and dict(config.cc_model_filenames)
    assert (root / "work" / "timing.cache").exists()
    check_manifest(manifest.read_manifest(root / "repo"), local_target())


def test_static_and_dynamic_engines_both_build(built_repo):
    spec, root = built_repo
    static = build_plan_variant(
        spec, root / "repo", root / "work", EngineOptions(precision="fp16", static_batch=8), repository.ServingOptions()
    )
    assert static["max_batch_size"] == 0 and static["timing"]["gpu_compute_mean_ms"] > 0
