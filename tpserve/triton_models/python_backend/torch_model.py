"""Triton Python-backend model serving a torch.export program (embedded target, torch runtime).

Copied into <repository>/<model>/<version>/model.py. The version folder holds model.pt2 (the
module as a torch.export program: no model source needed at serve time) and spec.json. What the
config's parameters mean and how the module runs: torch_serving.py. This file is the Python
backend's face of it: on a KIND_GPU instance inputs arrive through DLPack (on the GPU when the
client used CUDA shared memory, with FORCE_CPU_ONLY_INPUT_TENSORS=no) and outputs leave through
DLPack (from host memory with host_outputs=1, cheaper than handing GPU tensors back through CUDA IPC).

The in-process backend (backend.py) serves the same folders without this file's stub process.
"""

import json
import os
import sys

# The backend stub's interpreter ignores PYTHONPATH; honour it so the project's packages import.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from tpserve.triton_models.python_backend.cancelled_calls import CancelledCalls, serve_live  # noqa: E402
from tpserve.triton_models.runtime import torch_runtime as rt  # noqa: E402
from tpserve.triton_models.runtime.ragged_runner import STATS_VARIABLE  # noqa: E402
from tpserve.triton_models.runtime.torch_serving import TorchServing  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        gpu = args["model_instance_kind"] == "GPU"
        device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        stats = os.environ.get(STATS_VARIABLE)  # the stub's environment is how the server passes it
        self.serving = TorchServing(config, folder, device, stats_folder=stats)
        self.cancelled = CancelledCalls.from_environment()  # calls nobody waits for are answered unrun

    def execute(self, requests):
        return serve_live(requests, self.cancelled, self._execute, pb_utils)

    def _execute(self, requests):
        names = self.serving.input_names
        feeds = [[rt.from_triton(pb_utils.get_input_tensor_by_name(r, n)) for n in names] for r in requests]
        results = self.serving.run(feeds)
        responses = [self._response(r) for r in results]
        return responses

    def _response(self, result):
        if isinstance(result, Exception):
            error = pb_utils.TritonError(f"torch runtime failed: {result}", pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        # Host or device tensors alike leave through DLPack: under numpy 2 this server's stub sends tensors made
        # from numpy arrays empty (measured on the GPU host, numpy 2.5.2); see server.launcher.numpy_problem.
        outputs = self.serving.outputs
        tensors = [pb_utils.Tensor.from_dlpack(name, rt.to_dlpack(o)) for (name, _), o in zip(outputs, result)]
        return pb_utils.InferenceResponse(output_tensors=tensors)
