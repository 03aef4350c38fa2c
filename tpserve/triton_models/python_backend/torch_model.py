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

from tpserve.triton_models.python_backend.cancelled_calls import CancelledCalls, answer_checked, serve_live  # noqa: E402
from tpserve.triton_models.runtime import torch_runtime as rt  # noqa: E402
from tpserve.triton_models.runtime.input_checks import PARAMETER, InputChecks  # noqa: E402
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
        check = config.get("parameters", {}).get(PARAMETER, {}).get("string_value", "")
        self.checks = InputChecks.from_json(check)  # the spec's declaration, held per request
        self.batching = int(config.get("max_batch_size", 0)) > 0

    def execute(self, requests):
        return serve_live(requests, self.cancelled, self._checked, pb_utils)

    def _checked(self, requests):
        """_execute for the requests whose inputs fit the model's declaration; each other one answered alone with
        why, before the module runs (the words of the ONNX Runtime and in-process paths)."""
        names = self.serving.input_names
        read = lambda r: [rt.from_triton(pb_utils.get_input_tensor_by_name(r, n)) for n in names]  # noqa: E731
        seen = lambda tensors: _as_arrays(names, tensors)  # noqa: E731
        execute = lambda _live, feeds: self._execute(feeds)  # noqa: E731
        return answer_checked(requests, read, self.checks, self.batching, execute, pb_utils, seen=seen)

    def _execute(self, feeds):
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


def _as_arrays(names, tensors) -> dict:
    """What InputChecks reads of each input, the tensor left where it is (runtime/input_checks.py: TorchView)."""
    from tpserve.triton_models.runtime.input_checks import torch_views

    return torch_views(names, tensors)
