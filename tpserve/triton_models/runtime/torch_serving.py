"""A torch-runtime model folder loaded on one device: what both of its Triton faces run.

The faces: torch_model.py (the Python backend's model.py, a stub process per instance) and
backend.py (the in-process backend, no stub). Each turns Triton's tensors into torch tensors and
back; this class holds the rest: the config's parameters, the module (torch.export program, compiled or
not), the staged CUDA-graph path or the general one, and per-request outputs.

Parameters (config.pbtxt): precision (fp32|fp16|bf16), channels_last, cuda_graphs, graph_batch_sizes,
compiler ("inductor": warm-started from the build's compile_cache.bin), host_outputs, staged (with CUDA
graphs, default 1: torch_runtime.StagedRunner). uint8 NHWC images are normalized on the device; floating
inputs are cast to the precision, integer ones kept; outputs are cast to the config's dtypes.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import torch

from tpserve.triton_models.runtime import torch_runtime as rt
from tpserve.triton_models.runtime.input_checks import PARAMETER, holds_floats

TORCH_DTYPES = rt.TORCH_DTYPES


NUMPY_DTYPES = {  # Triton's datatypes -> numpy (the in-process backend's reads)
    "FP32": np.float32,
    "FP16": np.float16,
    "INT64": np.int64,
    "INT32": np.int32,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}


class TorchServing:
    """Loads the version folder's model.pt2 for `config` (Triton's JSON form) on `device`.

    Args:
        slots: staged requests that may be in flight at once (the in-process backend overlaps two).
        stats_folder: where a ragged runner writes its statistics (ragged_runner.RaggedRunner); None: nowhere.
    """

    def __init__(
        self, config: dict, folder: str, device: torch.device, slots: int = 1, stats_folder: str | None = None
    ):
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        with open(os.path.join(folder, "spec.json")) as handle:
            self.spec = json.load(handle)
        self.device, self.slots, self.name = device, slots, config.get("name", "model")
        self.dtype = rt.DTYPES[params.get("precision", "fp32")]
        self.host_outputs = params.get("host_outputs") == "1"
        self.channels_last = params.get("channels_last") == "1"
        self.uint8 = config["input"][0]["data_type"] == "TYPE_UINT8" and self.spec["inputs"][0]["dtype"] != "UINT8"
        self.input_names = [i["name"] for i in config["input"]]
        self.outputs = [(o["name"], TORCH_DTYPES.get(o["data_type"], torch.float32)) for o in config["output"]]
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.staged = self.ragged = False
        self.stats_folder = stats_folder
        self.runner = self._runner(folder, params, config["max_batch_size"])

    def on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _runner(self, folder, params, max_batch):
        module = rt.load_program(os.path.join(folder, "model.pt2"), self.device)
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        module = module.to(self.device, dtype=self.dtype, memory_format=fmt)
        if params.get("compiler") == "inductor":
            cache = os.path.join(folder, "compile_cache.bin")
            module = rt.compiled(module, open(cache, "rb").read() if os.path.exists(cache) else None)
        explicit = tuple(int(b) for b in params.get("graph_batch_sizes", "").split())
        first, alone = self.spec["inputs"][0], len(self.spec["inputs"]) == 1
        fixed = all(-1 not in i["dims"] for i in self.spec["inputs"])
        graphs = params.get("cuda_graphs") == "1" and fixed
        # float inputs declared finite or bounded are held on the general path, which reads every value
        native = not holds_floats(params.get(PARAMETER, ""))
        with self.on_stream():
            if sequence_model(self.spec) and params.get("ragged", "1") == "1" and native:
                self.ragged = True
                return self._ragged(module, params, max_batch)
            if graphs and alone and params.get("staged", "1") == "1" and native:  # a CPU runs the same steps eagerly
                self.staged = True
                return self._staged(module, first, rt.bucket_sizes(max_batch, explicit))
            if graphs and self.device.type == "cuda":
                (shape, dtype), *others = self._samples()
                buckets = rt.bucket_sizes(max_batch, explicit)
                return rt.GraphRunner(module, shape, dtype, self.device, buckets, self.channels_last, others)
            if isinstance(module, rt.DynamicBatch) and fixed and alone:  # compile both graphs now, not at a request
                self._warm(module, first, max_batch)
            return module

    def _samples(self) -> list[tuple[tuple, torch.dtype]]:
        """Per input, the per-sample shape and dtype the module takes (floats in the precision, the rest kept)."""
        samples = []
        for index, tensor in enumerate(self.spec["inputs"]):
            kind = TORCH_DTYPES[f"TYPE_{tensor['dtype']}"]
            floating = (index == 0 and self.uint8) or kind.is_floating_point
            samples.append((tuple(tensor["dims"]), self.dtype if floating else kind))
        return samples

    def wire(self) -> tuple[tuple, torch.dtype]:
        """Per-sample shape and dtype of the first input as requests carry it."""
        if self.uint8:
            pre = self.spec["preprocessing"]
            return (*pre["image_size"], pre["channels"]), torch.uint8
        first = self.spec["inputs"][0]
        return tuple(first["dims"]), TORCH_DTYPES[f"TYPE_{first['dtype']}"]

    def _staged(self, module, first, buckets):
        """The graph runs from the wire tensor (uint8 NHWC or the config's float) to the config's output dtypes."""
        prepare = self._formatted
        if self.uint8:
            pre = self.spec["preprocessing"]
            mean = torch.tensor(pre["mean"], device=self.device, dtype=torch.float32)
            std = torch.tensor(pre["std"], device=self.device, dtype=torch.float32)

            def prepare(batch):
                return rt.normalize_uint8(batch, mean, std, self.dtype, self.channels_last)

        def whole(batch):
            out = module(prepare(batch))
            out = list(out) if isinstance(out, (tuple, list)) else [out]
            return [o.to(dtype) for o, (_, dtype) in zip(out, self.outputs)]

        shape, dtype = self.wire()
        return rt.StagedRunner(whole, shape, dtype, self.device, buckets, slots=self.slots)

    def _ragged(self, module, params, max_batch):
        """Rows of every length batched together (triton_models/runtime/ragged.py); CUDA graphs over the grid's cells
        when the config asks for graphs on a GPU."""
        from tpserve.triton_models.runtime import ragged
        from tpserve.triton_models.runtime.ragged_runner import for_spec

        grid = ragged.grid_from_params(params, max_length(self.spec), max_batch)
        graphs = params.get("cuda_graphs") == "1"
        dtypes = [dtype for _, dtype in self.outputs]
        return for_spec(
            module,
            self.spec,
            grid,
            self.device,
            dtypes,
            graphs,
            self.name,
            slots=self.slots,
            stats_folder=self.stats_folder,
        )

    def _run_ragged(self, feeds: list[list[torch.Tensor]]) -> list:
        """Requests of any lengths as one batch (torch tensors in and out: the Python backend's face)."""
        arrays = [[t.cpu().numpy() if t.device.type != "cpu" else t.numpy() for t in feed] for feed in feeds]
        results = self.run_arrays(arrays)
        return [r if isinstance(r, Exception) else [torch.from_numpy(o) for o in r] for r in results]

    def run_arrays(self, feeds: list[list[np.ndarray]]) -> list:
        """Requests of any lengths as one batch, numpy in and out (the in-process backend reads Triton's buffers
        as arrays); a request longer than the model's longest length, or whose inputs disagree, fails alone."""
        from tpserve.triton_models.runtime.ragged import RaggedBatch

        names, longest = [i["name"] for i in self.spec["inputs"]], self.runner.grid.max_length
        results: list = [None] * len(feeds)
        kept = []
        for index, feed in enumerate(feeds):
            width = feed[0].shape[-1]
            if width > longest:
                results[index] = ValueError(
                    f"{names[0]}: {width} tokens per row exceed the model's longest length {longest}; "
                    f"truncate to {longest} tokens"
                )
            else:
                kept.append((index, dict(zip(names, feed))))
        if kept:
            try:
                batch = RaggedBatch([a for _, a in kept], names, self.runner.mask)
                with self.on_stream(), torch.inference_mode():  # each instance its own stream: they overlap
                    outputs = self.runner(batch)
            except Exception as err:  # e.g. a request whose inputs disagree in shape
                outputs = [err] if len(kept) == 1 else [self.run_arrays([feeds[i]])[0] for i, _ in kept]
            for (index, _), out in zip(kept, outputs):
                results[index] = out
        return results

    def _warm(self, module, first, max_batch):
        floating = self.uint8 or first["dtype"] in ("FP32", "FP16")
        dtype = self.dtype if floating else TORCH_DTYPES[f"TYPE_{first['dtype']}"]
        with torch.inference_mode():
            for batch in sorted({1, min(2, max_batch)}):
                module(self._formatted(torch.zeros((batch, *first["dims"]), dtype=dtype, device=self.device)))

    def run(self, feeds: list[list[torch.Tensor]]) -> list:
        """Each request's outputs (a list of tensors) or, where that request failed alone, its exception."""
        if self.ragged:
            return self._run_ragged(feeds)
        sizes = [f[0].shape[0] for f in feeds]
        if self.staged:
            with self.on_stream(), torch.inference_mode():
                outputs = self.runner([f[0] for f in feeds])
            return split(outputs, sizes)
        try:
            merged = [torch.cat(parts) if len(parts) > 1 else parts[0] for parts in zip(*feeds)]
            return split(self._run(merged), sizes)
        except Exception:  # e.g. requests with different lengths on a dynamic axis: run them one by one
            return [self._alone(f) for f in feeds]

    def _alone(self, feed):
        try:
            return self._run(feed)
        except Exception as err:  # one error per request, the server stays up
            return err

    def _run(self, inputs):
        with self.on_stream(), torch.inference_mode():
            moved = [x.to(self.device, non_blocking=True) for x in inputs]
            ready = [self._prepare(i, x) for i, x in enumerate(moved)]
            out = self.runner(*ready)
            out = list(out) if isinstance(out, (tuple, list)) else [out]
            out = [o.to(dtype) for o, (_, dtype) in zip(out, self.outputs)]
            if self.host_outputs:  # one device-to-host copy per execute
                return [o.cpu() for o in out]
        if self.stream is not None:
            self.stream.synchronize()
        return out

    def _prepare(self, index, tensor):
        if index == 0 and self.uint8:
            pre = self.spec["preprocessing"]
            return rt.normalize_uint8(tensor, pre["mean"], pre["std"], self.dtype, self.channels_last)
        return self._formatted(tensor)

    def _formatted(self, tensor):
        if tensor.is_floating_point():
            tensor = tensor.to(self.dtype)
            if self.channels_last and tensor.dim() == 4:
                tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor


def sequence_model(spec: dict) -> bool:
    """Whether every input is one sequence axis per sample ([-1]: token ids, masks): ragged batching applies."""
    return all(list(i["dims"]) == [-1] for i in spec["inputs"])


def max_length(spec: dict) -> int:
    """The longest sequence the spec allows (its first named axis's max; 512 when unbounded)."""
    axes = spec["inputs"][0].get("axes") or []
    bounds = spec.get("dynamic_axes", {}).get(axes[0]) if axes else None
    return int(bounds[1]) if bounds and bounds[1] else 512


def split(outputs: list[torch.Tensor], sizes: list[int]) -> list[list[torch.Tensor]]:
    """The batch's outputs cut back into each request's rows."""
    parts, start = [], 0
    for size in sizes:
        parts.append([o[start : start + size] for o in outputs])
        start += size
    return parts
