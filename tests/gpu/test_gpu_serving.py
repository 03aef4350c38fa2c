"""GPU paths for real: CUDA graphs, fp16, KIND_GPU instances, CUDA shared memory. Run on a GPU host
(verified on an H100 host: Ubuntu 24.04, Python 3.12, torch 2.11+cu130, no TensorRT)."""

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: run on a GPU host"),
]

from tpserve.builders.build import build_model, build_torch_variant  # noqa: E402
from tpserve.builders.repository.writer import ServingOptions, TorchRuntime  # noqa: E402
from tpserve.builders.request import BuildRequest  # noqa: E402
from tpserve.builders.spec import zoo  # noqa: E402
from tpserve.clients.admin import inference_statistics  # noqa: E402
from tpserve.clients.infer import infer  # noqa: E402
from tpserve.clients.shared_memory import infer_cuda_shm  # noqa: E402
from tpserve.server.triton import launcher  # noqa: E402
from tpserve.triton_models.runtime.torch_runtime import GraphRunner, normalize_uint8  # noqa: E402

SPEC = dict(image_size=64, max_batch_size=8)


@pytest.fixture(scope="module")
def gpu_served(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    spec = zoo.get_spec("resnet18", **SPEC)
    built = zoo.build_module(spec)
    # the ONNX build stays out of the served repository (served alone below)
    build_model(BuildRequest(spec=spec, target="embedded", repo=root / "scratch", work_dir=root / "work"), built)
    gpu = ServingOptions(instances=2, kind="KIND_GPU", dynamic_batching=False)  # 2 instances: no batcher
    compiled = dict(channels_last=True, cuda_graphs=True, compiler="inductor", host_outputs=True)
    for runtime in (
        TorchRuntime(precision="fp16", channels_last=True, cuda_graphs=True),
        TorchRuntime(precision="fp16", channels_last=True, cuda_graphs=True, uint8_input=True),
        TorchRuntime(precision="fp16", uint8_input=True, **compiled),
        TorchRuntime(precision="bf16", **compiled),
        TorchRuntime(precision="fp16", uint8_input=True, inprocess=True, **compiled),
    ):
        build_torch_variant(
            BuildRequest(spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work", options=gpu), runtime
        )
    with launcher.running(root / "repo", root / "state") as state:
        yield spec, built, state


def _reference(built, x):
    with torch.no_grad():
        return built.module(torch.from_numpy(x)).numpy()


def test_cuda_graphs_match_eager_in_fp16():
    module = zoo.architecture(zoo.get_spec("resnet18", **SPEC)).cuda().half().to(memory_format=torch.channels_last)
    runner = GraphRunner(module, (3, 64, 64), torch.float16, "cuda", (1, 4, 8), channels_last=True)
    assert sorted(runner.graphs) == [1, 4, 8]
    for count in (1, 3, 8):
        x = torch.randn(count, 3, 64, 64, device="cuda").half().contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            torch.testing.assert_close(runner(x), module(x), rtol=1e-2, atol=1e-2)


def test_uint8_normalization_on_the_gpu():
    pixels = torch.randint(0, 256, (2, 16, 16, 3), dtype=torch.uint8, device="cuda")
    out = normalize_uint8(pixels, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), torch.float16)
    assert out.is_cuda and out.shape == (2, 3, 16, 16)
    torch.testing.assert_close(
        out.float().cpu(), normalize_uint8(pixels.cpu(), (0.5,) * 3, (0.25,) * 3, torch.float32), rtol=1e-2, atol=1e-2
    )


def test_served_fp16_graphs_on_gpu_instances_match_pytorch(gpu_served):
    spec, built, state = gpu_served
    ep = state.endpoint("grpc")
    for batch in (1, 5, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 64, 64)).astype(np.float32)
        got = infer(ep, "resnet18_64_torch_fp16_graphs", {"input": x}).outputs["logits"]
        np.testing.assert_allclose(got, _reference(built, x), atol=5e-2, rtol=5e-2)
    with ep.client() as client:
        (stats,) = inference_statistics(ep, client, "resnet18_64_torch_fp16_graphs")
        config = client.get_model_config("resnet18_64_torch_fp16_graphs").config
    assert int(stats["inference_count"]) >= 14
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU and config.instance_group[0].count == 2


def test_cuda_shared_memory_round_trip(gpu_served):
    spec, built, state = gpu_served
    ep = state.endpoint("grpc")
    x = np.random.default_rng(0).standard_normal((4, 3, 64, 64)).astype(np.float32)
    out = infer_cuda_shm(ep, "resnet18_64_torch_fp16_graphs", {"input": x}, {"logits": (np.float32, (4, 1000))})
    np.testing.assert_allclose(out["logits"], _reference(built, x), atol=5e-2, rtol=5e-2)


def test_uint8_images_normalized_on_the_gpu_when_served(gpu_served):
    from PIL import Image

    from tpserve.clients.inputs import preprocess_image

    spec, built, state = gpu_served
    ep = state.endpoint("http")
    pixels = np.random.default_rng(2).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    got = infer(ep, "resnet18_64_torch_fp16_graphs_u8", {"input": pixels}).outputs["logits"]
    floats = np.stack([preprocess_image(Image.fromarray(p), spec) for p in pixels])
    np.testing.assert_allclose(got, _reference(built, floats), atol=5e-2, rtol=5e-2)


def test_compiled_engines_are_built_gated_and_served_on_the_gpu(gpu_served):
    from PIL import Image

    from tpserve.builders.repository.manifest import read_manifest
    from tpserve.clients.inputs import preprocess_image

    spec, built, state = gpu_served
    manifest = read_manifest(Path(state.repo))["models"]
    for name in ("resnet18_64_inductor_fp16_u8", "resnet18_64_inductor_bf16"):
        compiled = manifest[name]["compiled"]
        assert compiled["device"] == "cuda" and compiled["compute_capability"] and compiled["triton"]
        assert compiled["cache_bytes"] > 0 and manifest[name]["validation"]["passed"]
        assert (Path(state.repo) / name / "1" / "compile_cache.bin").stat().st_size == compiled["cache_bytes"]
    ep = state.endpoint("grpc")
    pixels = np.random.default_rng(3).integers(0, 256, (5, 64, 64, 3), dtype=np.uint8)
    floats = np.stack([preprocess_image(Image.fromarray(p), spec) for p in pixels])
    got = infer(ep, "resnet18_64_inductor_fp16_u8", {"input": pixels}).outputs["logits"]
    np.testing.assert_allclose(got, _reference(built, floats), atol=1e-1, rtol=2e-2)  # the gate's fp16 tolerance
    got = infer(ep, "resnet18_64_inductor_bf16", {"input": floats}).outputs["logits"]
    np.testing.assert_allclose(got, _reference(built, floats), atol=1.0, rtol=5e-2)


def test_the_in_process_backend_answers_like_the_python_backend_on_every_transport(gpu_served):
    """Same compiled engine, two backends: host memory over HTTP and gRPC, CUDA shared memory (inputs and
    outputs on the GPU), and concurrent requests (batches overlap in the in-process instance)."""
    from concurrent.futures import ThreadPoolExecutor

    spec, built, state = gpu_served
    pixels = np.random.default_rng(4).integers(0, 256, (6, 64, 64, 3), dtype=np.uint8)
    stub = infer(state.endpoint("grpc"), "resnet18_64_inductor_fp16_u8", {"input": pixels}).outputs["logits"]
    model = "resnet18_64_inductor_fp16_u8_inproc"
    for protocol in ("http", "grpc"):
        got = infer(state.endpoint(protocol), model, {"input": pixels}).outputs["logits"]
        np.testing.assert_allclose(got, stub, atol=2e-2, rtol=1e-2)
    shm = infer_cuda_shm(state.endpoint("grpc"), model, {"input": pixels}, {"logits": (np.float32, (6, 1000))})
    np.testing.assert_allclose(shm["logits"], stub, atol=2e-2, rtol=1e-2)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: infer(state.endpoint("grpc"), model, {"input": pixels[i : i + 1]}), range(6)))
    for i, answer in enumerate(answers):
        np.testing.assert_allclose(answer.outputs["logits"], stub[i : i + 1], atol=2e-2, rtol=1e-2)


def test_an_onnx_runtime_model_is_served_whatever_numpy_the_host_has(tmp_path):
    """A GPU host's numpy 2: the ONNX Runtime model's tensors cross the stub through DLPack and answer whole."""
    spec = zoo.get_spec("digits_cnn", max_batch_size=8)
    built = zoo.build_module(spec)
    build_model(BuildRequest(spec=spec, target="embedded", repo=tmp_path / "repo", work_dir=tmp_path / "work"), built)
    rows = np.random.default_rng().standard_normal((3, *spec.inputs[0].dims)).astype(np.float32)
    with launcher.running(tmp_path / "repo", tmp_path / "state") as state:
        assert spec.name not in state.left_out
        got = infer(state.endpoint("http"), spec.name, {spec.inputs[0].name: rows}).outputs[spec.outputs[0].name]
    with torch.no_grad():
        want = built.module(torch.from_numpy(rows)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
