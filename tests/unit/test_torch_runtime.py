"""The torch runtime's bookkeeping on the CPU: graph buckets, padding, uint8 normalization, DLPack."""

import numpy as np
import pytest
import torch

from clients.inputs import preprocess_image
from triton_models import torch_runtime as rt


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


def test_uint8_normalization_matches_the_client_preprocessing():
    from PIL import Image

    from builders import zoo

    spec = zoo.get_spec("resnet18", image_size=32)
    pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    got = rt.normalize_uint8(torch.from_numpy(pixels), spec.preprocessing.mean, spec.preprocessing.std, torch.float32)
    want = np.stack([preprocess_image(Image.fromarray(p), spec) for p in pixels])
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    half = rt.normalize_uint8(torch.from_numpy(pixels), spec.preprocessing.mean, spec.preprocessing.std,
                              torch.float16, channels_last=True)  # fmt: skip
    assert half.dtype == torch.float16 and half.is_contiguous(memory_format=torch.channels_last)


def test_dlpack_exchange_is_zero_copy():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = torch.utils.dlpack.from_dlpack(rt.to_dlpack(x))
    y[0, 0] = 42
    assert x[0, 0] == 42 and y.data_ptr() == x.data_ptr()
