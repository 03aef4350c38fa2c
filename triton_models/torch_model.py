"""Triton Python-backend model serving a torch.export program (embedded target, torch runtime).

Copied into <repository>/<model>/<version>/model.py. The version folder holds model.pt2 (the
module as a torch.export program: no model source needed at serve time) and spec.json.
Parameters (config.pbtxt): precision (fp32|fp16|bf16), channels_last, cuda_graphs,
graph_batch_sizes, compiler ("inductor": a compiled engine, warm-started from the build's
compile_cache.bin in the version folder), host_outputs (1: outputs copied to host memory in
the stub, cheaper than handing GPU tensors back through CUDA IPC). On a KIND_GPU instance:
inputs arrive through DLPack (on the GPU when the client used CUDA shared memory, with
FORCE_CPU_ONLY_INPUT_TENSORS=no), uint8 NHWC images are normalized on the GPU, the module runs
on the instance's own CUDA stream (through a CUDA graph per batch bucket when enabled: single
fixed-shape input only), and outputs leave through DLPack without a host round trip (or, with
host_outputs, in one device-to-host copy per execute). Any number of inputs and outputs; floating inputs are cast
to the precision, integer ones kept; outputs are cast to the dtypes of the config.

With CUDA graphs on a GPU, requests take the staged path (torch_runtime.StagedRunner, parameter staged=1, the
default): pinned staging, one host-to-device copy into the graph's input, normalization and casts inside the
graph, one device-to-host copy into pinned memory, one synchronize. staged=0 keeps the earlier path, for
comparison. TRITON_TORCH_PROFILE=<file> appends each execute's per-step microseconds to that file (JSON lines;
the GPU is synchronized between steps while profiling, so time it apart from throughput runs).
"""

import json
import os
import sys

# The backend stub's interpreter ignores PYTHONPATH; honour it so the project's packages import.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from triton_models import torch_runtime as rt  # noqa: E402

_TORCH_DTYPES = {
    "TYPE_FP32": torch.float32,
    "TYPE_FP16": torch.float16,
    "TYPE_INT64": torch.int64,
    "TYPE_INT32": torch.int32,
    "TYPE_UINT8": torch.uint8,
    "TYPE_BOOL": torch.bool,
}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, "spec.json")) as handle:
            self.spec = json.load(handle)
        gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        self.dtype = rt.DTYPES[params.get("precision", "fp32")]
        self.host_outputs = params.get("host_outputs") == "1"
        self.channels_last = params.get("channels_last") == "1"
        self.uint8 = config["input"][0]["data_type"] == "TYPE_UINT8" and self.spec["inputs"][0]["dtype"] != "UINT8"
        self.input_names = [i["name"] for i in config["input"]]
        self.outputs = [(o["name"], _TORCH_DTYPES.get(o["data_type"], torch.float32)) for o in config["output"]]
        self.stream = torch.cuda.Stream(self.device) if gpu else None
        self.staged = False
        self.runner = self._runner(folder, params, config["max_batch_size"])
        self.profile = rt.StepTimes(
            os.environ.get("TRITON_TORCH_PROFILE"), args["model_name"], self.staged, self.device if gpu else None
        )

    def _runner(self, folder, params, max_batch):
        module = torch.export.load(os.path.join(folder, "model.pt2")).module()
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        module = module.to(self.device, dtype=self.dtype, memory_format=fmt)
        if params.get("compiler") == "inductor":
            cache = os.path.join(folder, "compile_cache.bin")
            module = rt.compiled(module, open(cache, "rb").read() if os.path.exists(cache) else None)
        explicit = tuple(int(b) for b in params.get("graph_batch_sizes", "").split())
        first = self.spec["inputs"][0]
        fixed = len(self.spec["inputs"]) == 1 and -1 not in first["dims"]
        graphs = params.get("cuda_graphs") == "1" and self.device.type == "cuda" and fixed
        with self._on_stream():
            if graphs and params.get("staged", "1") == "1":
                self.staged = True
                return self._staged(module, first, rt.bucket_sizes(max_batch, explicit))
            if graphs:
                buckets = rt.bucket_sizes(max_batch, explicit)
                return rt.GraphRunner(
                    module, tuple(first["dims"]), self.dtype, self.device, buckets, self.channels_last
                )
            if isinstance(module, rt.DynamicBatch) and fixed:  # compile both graphs now, not at the first request
                self._warm(module, first, max_batch)
            return module

    def _staged(self, module, first, buckets):
        """The graph runs from the wire tensor (uint8 NHWC or the config's float) to the config's output dtypes."""
        if self.uint8:
            pre = self.spec["preprocessing"]
            mean = torch.tensor(pre["mean"], device=self.device, dtype=torch.float32)
            std = torch.tensor(pre["std"], device=self.device, dtype=torch.float32)
            wire_shape = (*pre["image_size"], pre["channels"])

            def prepare(batch):
                return rt.normalize_uint8(batch, mean, std, self.dtype, self.channels_last)

            wire_dtype = torch.uint8
        else:
            wire_shape, wire_dtype, prepare = (
                tuple(first["dims"]),
                _TORCH_DTYPES[f"TYPE_{first['dtype']}"],
                self._formatted,
            )

        def whole(batch):
            out = module(prepare(batch))
            out = list(out) if isinstance(out, (tuple, list)) else [out]
            return [o.to(dtype) for o, (_, dtype) in zip(out, self.outputs)]

        return rt.StagedRunner(whole, wire_shape, wire_dtype, self.device, buckets)

    def _warm(self, module, first, max_batch):
        floating = self.uint8 or first["dtype"] in ("FP32", "FP16")
        dtype = self.dtype if floating else _TORCH_DTYPES[f"TYPE_{first['dtype']}"]
        with torch.inference_mode():
            for batch in sorted({1, min(2, max_batch)}):
                module(self._formatted(torch.zeros((batch, *first["dims"]), dtype=dtype, device=self.device)))

    def _on_stream(self):
        import contextlib

        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def execute(self, requests):
        steps = self.profile.start()
        feeds = [[rt.from_triton(pb_utils.get_input_tensor_by_name(r, n)) for n in self.input_names] for r in requests]
        sizes = [f[0].shape[0] for f in feeds]
        steps.mark("inputs from Triton (DLPack)")
        if self.staged:
            with self._on_stream(), torch.inference_mode():
                outputs = self.runner([f[0] for f in feeds])
            steps.mark("staged: copies in, graph, copies out, one sync")
        else:
            try:
                merged = [torch.cat(parts) if len(parts) > 1 else parts[0] for parts in zip(*feeds)]
                steps.mark("merge (torch.cat)")
                outputs = self._run(merged, steps)
            except Exception:  # e.g. requests with different lengths on a dynamic axis: run them one by one
                return [self._respond_alone(f) for f in feeds]
        responses = [self._response([o[start : start + n] for o in outputs]) for start, n in _spans(sizes)]
        steps.mark("responses (DLPack out)")
        self.profile.write(steps, sum(sizes))
        return responses

    def _respond_alone(self, feed):
        try:
            return self._response(self._run(feed))
        except Exception as err:  # one error per request, the server stays up
            error = pb_utils.TritonError(f"torch runtime failed: {err}", pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)

    def _run(self, inputs, steps=None):
        steps = steps or rt.StepTimes.NONE
        with self._on_stream(), torch.inference_mode():
            moved = [x.to(self.device, non_blocking=True) for x in inputs]
            steps.mark("to device")
            ready = [self._prepare(i, x) for i, x in enumerate(moved)]
            steps.mark("normalize / cast")
            out = self.runner(*ready)
            out = list(out) if isinstance(out, (tuple, list)) else [out]
            steps.mark("module (graph replay, clone)")
            out = [o.to(dtype) for o, (_, dtype) in zip(out, self.outputs)]
            steps.mark("output casts")
            if self.host_outputs:  # one device-to-host copy per execute, then plain shared memory
                out = [o.cpu() for o in out]
                steps.mark("to host (.cpu)")
                return out
        if self.stream is not None:
            self.stream.synchronize()
        steps.mark("synchronize")
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

    def _response(self, outputs):
        # Host or device tensors alike leave through DLPack: under numpy 2 this server's stub sends tensors made
        # from numpy arrays empty (measured on the GPU host, numpy 2.5.2); see server.launcher.numpy_problem.
        tensors = [pb_utils.Tensor.from_dlpack(name, rt.to_dlpack(o)) for (name, _), o in zip(self.outputs, outputs)]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _spans(sizes):
    start = 0
    for size in sizes:
        yield start, size
        start += size
