"""The torch runtime's bookkeeping on the CPU: graph buckets, padding, uint8 normalization, DLPack."""

import numpy as np
import pytest
import torch

from tpserve.clients.inputs import preprocess_image
from tpserve.triton_models.runtime import torch_runtime as rt


def test_buckets_are_powers_of_two_and_the_max():
    assert rt.bucket_sizes(12) == (1, 2, 4, 8, 12)
    assert rt.bucket_sizes(64, (8, 32)) == (8, 32, 64)
    with pytest.raises(ValueError, match="within 1..8"):
        rt.bucket_sizes(8, (16,))


def test_a_batch_goes_to_the_smallest_bucket_that_holds_it():
    buckets = (1, 2, 4, 8)
    assert [rt.pick_bucket(n, buckets) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    with pytest.raises(ValueError, match="exceeds the largest captured size 8"):
        rt.pick_bucket(9, buckets)


def test_runner_pads_into_static_buffers_and_returns_only_the_real_rows():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)).eval()
    runner = rt.GraphRunner(module, (3, 8, 8), torch.float32, "cpu", (1, 4, 8))
    buffer = runner.inputs[4]
    for count in (1, 3, 4, 7):
        x = torch.randn(count, 3, 8, 8)
        got = runner(x)
        assert got.shape == (count, 5)
        torch.testing.assert_close(got, module(x), rtol=1e-5, atol=1e-5)
    assert runner.inputs[4] is buffer  # reused, not reallocated
    assert runner.graphs == {}  # nothing is captured on a CPU device


class _Tabular(torch.nn.Module):
    """Two inputs of fixed dims (features, a category id), two outputs (a score, class probabilities)."""

    def __init__(self):
        super().__init__()
        self.embed, self.body = torch.nn.Embedding(4, 3), torch.nn.Linear(6 + 3, 3)

    def forward(self, features, category):
        hidden = self.body(torch.cat([features, self.embed(category[:, 0])], dim=1))
        return hidden.sum(dim=1, keepdim=True), hidden.softmax(dim=1)


def test_runner_takes_several_inputs_of_fixed_dims_and_answers_every_output():
    torch.manual_seed(0)
    module = _Tabular().eval()
    runner = rt.GraphRunner(module, (6,), torch.float32, "cpu", (1, 4, 8), others=[((1,), torch.int64)])
    assert [b.dtype for b in runner.inputs[4]] == [torch.float32, torch.int64]
    for count in (1, 3, 8):
        features, category = torch.randn(count, 6), torch.randint(0, 4, (count, 1))
        score, probs = runner(features, category)
        assert score.shape == (count, 1) and probs.shape == (count, 3)
        want = module(features, category)
        torch.testing.assert_close(score, want[0])
        torch.testing.assert_close(probs, want[1])
    with pytest.raises(ValueError):
        runner(torch.randn(2, 6))  # every input or none


def test_uint8_normalization_matches_the_client_preprocessing():
    from PIL import Image

    from tpserve.builders.spec import zoo

    spec = zoo.get_spec("resnet18", image_size=32)
    pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    got = rt.normalize_uint8(torch.from_numpy(pixels), spec.preprocessing.mean, spec.preprocessing.std, torch.float32)
    want = np.stack([preprocess_image(Image.fromarray(p), spec) for p in pixels])
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    half = rt.normalize_uint8(
        torch.from_numpy(pixels), spec.preprocessing.mean, spec.preprocessing.std, torch.float16, channels_last=True
    )
    assert half.dtype == torch.float16 and half.is_contiguous(memory_format=torch.channels_last)


def test_dlpack_exchange_is_zero_copy():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = torch.utils.dlpack.from_dlpack(rt.to_dlpack(x))
    y[0, 0] = 42
    assert x[0, 0] == 42 and y.data_ptr() == x.data_ptr()


def test_the_staged_runner_batches_requests_without_cat_and_answers_on_the_host():
    import torch

    from tpserve.triton_models.runtime.torch_runtime import StagedRunner

    def whole(batch):  # the wire tensor (uint8) to the outputs, as the served graph does
        x = batch.float() / 255
        return [x.sum(dim=1), (x * 2).to(torch.float16)]

    runner = StagedRunner(whole, (3, 4), torch.uint8, "cpu", (1, 2, 4))
    parts = [torch.full((1, 3, 4), 255, dtype=torch.uint8), torch.zeros((2, 3, 4), dtype=torch.uint8)]
    first, second = runner(parts)
    assert first.shape == (3, 4) and first[0].tolist() == [3.0] * 4 and first[1:].abs().sum() == 0
    assert second.dtype == torch.float16 and second.shape == (3, 3, 4) and second.device.type == "cpu"
    again, _ = runner([torch.zeros((1, 3, 4), dtype=torch.uint8)])  # buffers reused: a fresh answer, not stale
    assert again.shape == (1, 4) and again.abs().sum() == 0 and first[0].tolist() == [3.0] * 4


def test_the_unstaged_variant_has_a_name_of_its_own():
    from tpserve.builders.repository.writer import TorchRuntime

    staged = TorchRuntime(precision="fp16", uint8_input=True, cuda_graphs=True, compiler="inductor")
    earlier = TorchRuntime(precision="fp16", uint8_input=True, cuda_graphs=True, compiler="inductor", staged=False)
    assert staged.variant("resnet50") == "resnet50_inductor_fp16_u8"
    assert earlier.variant("resnet50") == "resnet50_inductor_fp16_u8_unstaged"


def test_staged_slots_hold_two_batches_at_once_and_rows_written_by_the_caller():
    """Two batches submitted before either is collected keep their own answers; Staged rows come from the slot's
    staging, where the caller (the in-process backend) wrote them."""
    import ctypes

    from tpserve.triton_models.runtime.torch_runtime import Staged, StagedRunner

    runner = StagedRunner(lambda b: [b.float().sum(dim=(1, 2))], (3, 4), torch.uint8, "cpu", (1, 2, 4), slots=2)
    address, row_bytes = runner.staging(1)
    assert row_bytes == 12
    rows = torch.full((2, 3, 4), 2, dtype=torch.uint8)
    ctypes.memmove(address, rows.data_ptr(), 2 * row_bytes)
    first = runner.submit([torch.ones((1, 3, 4), dtype=torch.uint8)], 0)
    second = runner.submit([Staged(2)], 1)
    assert runner.collect(second)[0].tolist() == [24.0, 24.0]
    assert runner.collect(first)[0].tolist() == [12.0]


def test_the_in_process_variant_names_its_backend():
    from tpserve.builders.repository.writer import INPROCESS_BACKEND, ServingOptions, TorchRuntime, torch_config
    from tpserve.builders.spec import zoo

    spec = zoo.get_spec("resnet18", image_size=64, max_batch_size=4)
    runtime = TorchRuntime(precision="fp16", uint8_input=True, cuda_graphs=True, compiler="inductor", inprocess=True)
    assert runtime.variant("resnet18") == "resnet18_inductor_fp16_u8_inproc"
    config = torch_config(spec, runtime, ServingOptions(kind="KIND_GPU"))
    assert config.backend == INPROCESS_BACKEND == "torch_inprocess"
    assert 'backend: "torch_inprocess"' in config.to_pbtxt()
    assert config.parameters["runtime"] == "torch"
    stub = torch_config(spec, TorchRuntime(precision="fp16"), ServingOptions())
    assert stub.backend == "python"


def test_cuda_graphs_take_several_inputs_of_fixed_dims_and_refuse_a_dynamic_one():
    import dataclasses

    from tpserve.builders.repository.writer import ServingOptions, TorchRuntime, torch_config
    from tpserve.builders.spec import zoo
    from tpserve.builders.spec.model_spec import TensorSpec
    from tpserve.common.errors import ConfigError

    spec = zoo.get_spec("digits_cnn")
    tabular = dataclasses.replace(spec, inputs=(*spec.inputs, TensorSpec(name="category", dtype="INT64", dims=(1,))))
    runtime = TorchRuntime(precision="fp16", cuda_graphs=True, compiler="inductor", inprocess=True)
    config = torch_config(tabular, runtime, ServingOptions(kind="KIND_GPU"))
    assert config.parameters["cuda_graphs"] == 1
    dynamic = dataclasses.replace(spec, inputs=(*spec.inputs, TensorSpec(name="tags", dtype="INT64", dims=(-1,))))
    with pytest.raises(ConfigError, match="CUDA graphs need inputs of fixed per-sample dims"):
        torch_config(dynamic, runtime, ServingOptions(kind="KIND_GPU"))


def test_a_server_builds_the_in_process_backend_only_for_a_repository_that_names_it(tmp_path):
    from tpserve.server.triton.inprocess_build import uses_inprocess

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_text('name: "a"\nbackend: "python"\n')
    assert not uses_inprocess(tmp_path)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.pbtxt").write_text('name: "b"\nbackend: "torch_inprocess"\n')
    assert uses_inprocess(tmp_path)
