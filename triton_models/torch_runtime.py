"""The torch runtime of the embedded target: what torch_model.py runs inside Triton.

Kept apart from model.py so that it is importable, and its bookkeeping testable, without
Triton or a GPU: CUDA-graph buckets (pad a batch up to a captured size, replay, slice),
uint8 images normalized on the device, DLPack exchange with Triton's tensors, and the
compiled engines (torch.compile with inductor, warm-started from the build's portable cache).
"""

from __future__ import annotations

import torch


def bucket_sizes(max_batch: int, explicit: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Batch sizes to capture: the explicit ones, else powers of two up to max_batch, and max_batch."""
    sizes = set(explicit) if explicit else {2**i for i in range(max_batch.bit_length()) if 2**i <= max_batch}
    sizes.add(max_batch)
    if min(sizes) < 1 or max(sizes) > max_batch:
        raise ValueError(f"graph batch sizes {sorted(sizes)} must lie within 1..{max_batch}")
    return tuple(sorted(sizes))


def pick_bucket(batch: int, buckets: tuple[int, ...]) -> int:
    """The smallest captured size that holds the batch."""
    for size in buckets:
        if size >= batch:
            return size
    raise ValueError(f"batch {batch} exceeds the largest captured size {buckets[-1]}")


class GraphRunner:
    """Runs a module through one CUDA graph per bucket size, on static input/output buffers.

    On a CPU device nothing is captured: the same buffers and bucketing run eagerly, which is
    what the unit tests exercise.
    """

    def __init__(self, module, sample_shape: tuple, dtype, device, buckets: tuple[int, ...], channels_last=False):
        self.module, self.buckets, self.device = module, buckets, torch.device(device)
        fmt = torch.channels_last if channels_last and len(sample_shape) == 3 else torch.contiguous_format
        self.inputs = {
            b: torch.zeros((b, *sample_shape), dtype=dtype, device=device).to(memory_format=fmt) for b in buckets
        }
        self.outputs, self.graphs = {}, {}
        for size in buckets:
            self._capture(size)

    def _capture(self, size: int) -> None:
        with torch.inference_mode():
            if self.device.type != "cuda":
                return
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(3):  # warm up kernels (cuDNN autotuning) outside the capture
                    self.module(self.inputs[size])
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs[size] = self.module(self.inputs[size])
            self.graphs[size] = graph

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        count = batch.shape[0]
        size = pick_bucket(count, self.buckets)
        static = self.inputs[size]
        static[:count].copy_(batch, non_blocking=True)
        if size in self.graphs:
            self.graphs[size].replay()
            out = self.outputs[size]
        else:
            with torch.inference_mode():
                out = self.module(static)
        return out[:count].clone()  # the static output is overwritten by the next replay


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RECOMPILE_LIMIT = 64  # one graph for batch 1, one dynamic for the rest, more for other axis lengths


def compiled(module, cache: bytes | None = None):
    """module through torch.compile (inductor), its batch axis dynamic above 1.

    Args:
        cache: portable compile artifacts (torch.compiler.save_cache_artifacts at build time),
            loaded first so that compiling reuses the build's kernels instead of starting over.
    """
    if cache:
        torch.compiler.load_cache_artifacts(cache)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, RECOMPILE_LIMIT)
    return DynamicBatch(torch.compile(module))


class DynamicBatch:
    """Calls a compiled module with the batch axis of every input marked dynamic (batch 1 stays static).

    One graph then serves every batch size above 1 (no recompilation per bucket); batch 1 gets
    its own, specialized graph, as dynamo specializes sizes 0 and 1 anyway.
    """

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *inputs):
        for tensor in inputs:
            if tensor.dim() and tensor.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return self.fn(*inputs)


def normalize_uint8(images: torch.Tensor, mean, std, dtype, channels_last: bool = False) -> torch.Tensor:
    """NHWC uint8 images -> normalized NCHW in dtype, on the images' device (the GPU, served)."""
    mean_t = torch.tensor(mean, device=images.device, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=images.device, dtype=torch.float32).view(1, -1, 1, 1)
    nchw = images.permute(0, 3, 1, 2).float().div_(255.0).sub_(mean_t).div_(std_t).to(dtype)
    return nchw.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def from_triton(tensor) -> torch.Tensor:
    """A Triton (pb_utils) tensor as a torch tensor, zero-copy through DLPack (GPU stays GPU)."""
    return torch.utils.dlpack.from_dlpack(tensor.to_dlpack())


def to_dlpack(tensor: torch.Tensor):
    """A torch tensor as a DLPack capsule for pb_utils.Tensor.from_dlpack (zero-copy)."""
    return torch.utils.dlpack.to_dlpack(tensor.contiguous())
