"""Triton Python-backend model serving a torch module (embedded target, torch runtime).

Copied into <repository>/<model>/<version>/model.py. The version folder holds model.pt
(a state_dict) and spec.json. Parameters (config.pbtxt): precision (fp32|fp16),
channels_last, cuda_graphs, graph_batch_sizes. On a KIND_GPU instance: inputs arrive through
DLPack (on the GPU when the client used CUDA shared memory, with
FORCE_CPU_ONLY_INPUT_TENSORS=no), uint8 NHWC images are normalized on the GPU, the module
runs on the instance's own CUDA stream (through a CUDA graph per batch bucket when enabled),
and outputs leave through DLPack without a host round trip.
"""

import json
import os
import sys

# The backend stub's interpreter ignores PYTHONPATH; honour it so the project's packages import.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from builders.backends import torch_runtime as rt  # noqa: E402
from builders.spec import ModelSpec  # noqa: E402
from builders.zoo import architecture  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, "spec.json")) as handle:
            self.spec = ModelSpec.from_dict(json.load(handle))
        gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        self.dtype = torch.float16 if params.get("precision") == "fp16" else torch.float32
        self.channels_last = params.get("channels_last") == "1"
        self.uint8 = config["input"][0]["data_type"] == "TYPE_UINT8"
        self.input_name, self.output_names = config["input"][0]["name"], [o["name"] for o in config["output"]]
        self.stream = torch.cuda.Stream(self.device) if gpu else None
        self.runner = self._runner(folder, params, config["max_batch_size"])

    def _runner(self, folder, params, max_batch):
        module = architecture(self.spec)
        module.load_state_dict(torch.load(os.path.join(folder, "model.pt"), map_location="cpu"))
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        module = module.to(self.device, dtype=self.dtype, memory_format=fmt).eval()
        explicit = tuple(int(b) for b in params.get("graph_batch_sizes", "").split())
        buckets = rt.bucket_sizes(max_batch, explicit)
        graphs = params.get("cuda_graphs") == "1" and self.device.type == "cuda"
        with self._on_stream():
            if graphs:
                return rt.GraphRunner(module, tuple(self.spec.inputs[0].dims), self.dtype, self.device, buckets,
                                      self.channels_last)  # fmt: skip
            return lambda x: module(x)

    def _on_stream(self):
        import contextlib

        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def execute(self, requests):
        batches = [rt.from_triton(pb_utils.get_input_tensor_by_name(r, self.input_name)) for r in requests]
        sizes = [b.shape[0] for b in batches]
        try:
            outputs = self._run(torch.cat(batches) if len(batches) > 1 else batches[0])
        except Exception as err:  # one error per request, the server stays up
            error = pb_utils.TritonError(f"torch runtime failed: {err}", pb_utils.TritonError.INVALID_ARG)
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        return [self._response(part) for part in outputs.split(sizes)]

    def _run(self, batch):
        with self._on_stream(), torch.inference_mode():
            batch = batch.to(self.device, non_blocking=True)
            if self.uint8:
                pre = self.spec.preprocessing
                batch = rt.normalize_uint8(batch, pre.mean, pre.std, self.dtype, self.channels_last)
            else:
                batch = batch.to(self.dtype)
            out = self.runner(batch).float()
        if self.stream is not None:
            self.stream.synchronize()
        return out

    def _response(self, output):
        tensor = pb_utils.Tensor.from_dlpack(self.output_names[0], rt.to_dlpack(output))
        return pb_utils.InferenceResponse(output_tensors=[tensor])
