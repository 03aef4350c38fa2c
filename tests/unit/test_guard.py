"""The version and hardware guard, on manifests as the builders write them."""

import pytest

from tpserve.builders.build import build_model
from tpserve.builders.checks.guard import GuardError, Target, check_manifest
from tpserve.builders.repository.manifest import read_manifest, update_manifest
from tpserve.builders.request import BuildRequest
from tpserve.common.errors import ToolError
from tpserve.server.triton import launcher

H100 = Target("10.13.3", "9.0", "NVIDIA H100 80GB HBM3", "image tritonserver:25.08-py3")


def _engine(trt="10.13.3", cc="9.0", gpu="NVIDIA H100 80GB HBM3", **flags):
    return {"tensorrt": trt, "cuda": "13.0", "gpu": gpu, "compute_capability": cc, "precision": "fp16", **flags}


@pytest.fixture
def repo(digits_build, tmp_path):
    """A real manifest (digits_cnn as built) to which plan entries are added."""
    spec, built, _ = digits_build
    build_model(BuildRequest(spec=spec, target="ngc", repo=tmp_path / "repo", work_dir=tmp_path / "work"), built)
    return tmp_path / "repo"


def _add_plan(repo, name, *engines):
    update_manifest(repo, {"name": name, "precision": "fp16", "engines": {e["compute_capability"]: e for e in engines}})
    return read_manifest(repo)


def test_a_matching_plan_passes_and_onnx_models_are_not_judged(repo):
    check_manifest(_add_plan(repo, "digits_cnn_trt_fp16", _engine()), H100)


def test_another_tensorrt_version_is_refused_with_the_fix(repo):
    manifest = _add_plan(repo, "digits_cnn_trt_fp16", _engine(trt="10.3.0"))
    with pytest.raises(GuardError, match="plan built with TensorRT 10.3.0, image .* has TensorRT 10.13.3; rebuild"):
        check_manifest(manifest, H100)


def test_a_plan_for_another_compute_capability_is_refused(repo):
    manifest = _add_plan(repo, "digits_cnn_trt_fp16", _engine(cc="8.0", gpu="NVIDIA A100-SXM4-80GB"))
    with pytest.raises(GuardError, match=r"built for compute capability 8.0 \(NVIDIA A100-SXM4-80GB\).* \(9.0\)"):
        check_manifest(manifest, H100)


def test_per_architecture_plans_pass_if_one_fits(repo):
    a100 = _engine(cc="8.0", gpu="NVIDIA A100-SXM4-80GB")
    check_manifest(_add_plan(repo, "digits_cnn_trt_fp16", a100, _engine()), H100)


def test_hardware_compatible_plans_need_ampere_or_newer(repo):
    manifest = _add_plan(repo, "m", _engine(cc="8.6", hardware_compatible=True))
    check_manifest(manifest, H100)
    with pytest.raises(GuardError, match="Ampere\\+"):
        check_manifest(manifest, Target("10.13.3", "7.5", "Tesla T4", "this host"))


def test_version_compatible_plans_need_the_same_major_and_no_older(repo):
    manifest = _add_plan(repo, "m", _engine(trt="10.3.0", version_compatible=True))
    check_manifest(manifest, H100)
    with pytest.raises(GuardError, match="needs TensorRT 10.x >= 10.3.0"):
        check_manifest(manifest, Target("10.1.0", "9.0", "H100", "this host"))


def test_the_embedded_server_refuses_plans_before_starting(repo, tmp_path):
    _add_plan(repo, "digits_cnn_trt_fp16", _engine())
    with pytest.raises(ToolError, match="the embedded tritonserver .* has no TensorRT"):
        launcher.start(launcher.ServerSettings(repo, state_dir=tmp_path / "state"))
    assert not (tmp_path / "state" / "server.json").exists()


def _compiled(device="cuda", torch="2.11.0", triton="3.6.0", cc="9.0"):
    gpu = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": cc} if device == "cuda" else None
    return {
        "name": "resnet50_inductor_fp16",
        "precision": "fp16",
        "compiled": {
            "compiler": "inductor",
            "torch": torch,
            "triton": triton,
            "device": device,
            "gpu": gpu,
            **({"compute_capability": cc} if device == "cuda" else {}),
        },
    }


HOST = Target(None, "9.0", "NVIDIA H100 80GB HBM3", "this host", torch="2.11.0", triton="3.6.0")


def test_a_compiled_engine_that_fits_the_host_passes(repo):
    update_manifest(repo, _compiled())
    check_manifest(read_manifest(repo), HOST)


@pytest.mark.parametrize(
    "entry, host, message",
    [
        (
            _compiled(torch="2.10.0"),
            HOST,
            r"with torch 2.10.0, this host has torch 2.11.0; rebuild .* server host",
        ),
        (_compiled(triton="3.5.1"), HOST, r"kernels compiled with triton 3.5.1, this host has triton 3.6.0; rebuild"),
        (
            _compiled(cc="8.0"),
            HOST,
            r"compiled for compute capability 8.0 .* this host has NVIDIA H100 .* \(9.0\)",
        ),
        (
            _compiled(),
            Target(None, None, None, "this host", torch="2.11.0", triton="3.6.0"),
            "has none; serve the ONNX",
        ),
        (_compiled(), Target(None, "9.0", "H100", "this host"), "this host has no torch"),
    ],
)
def test_a_compiled_engine_for_another_torch_triton_or_gpu_is_refused(repo, entry, host, message):
    update_manifest(repo, entry)
    with pytest.raises(GuardError, match=message):
        check_manifest(read_manifest(repo), host)


def test_a_cpu_engine_is_judged_by_torch_only(repo):
    update_manifest(repo, _compiled(device="cpu", triton=None))
    check_manifest(read_manifest(repo), Target(None, None, None, "this host", torch="2.11.0", triton=None))
    with pytest.raises(GuardError, match="compiled with torch 2.11.0, this host has torch 2.12.0"):
        check_manifest(read_manifest(repo), Target(None, None, None, "this host", torch="2.12.0"))
