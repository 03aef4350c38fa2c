"""Triton Python-backend model serving an ONNX artifact with ONNX Runtime (embedded target).

Copied into <repository>/<model>/<version>/model.py by the repository writer. Parameters
(config.pbtxt): artifact (file name in the version folder), intra_op_threads (0: the cores shared among the
model's instances).
Requests of one dynamic batch run as one ONNX Runtime call; if that call fails, each
request runs alone, so a bad request gets its own error and the others still succeed.
Sequence models (every input [-1], allow_ragged_batch): requests of different lengths arrive in one
batch; their rows are grouped by length (triton_models/runtime/ragged.py) and each group runs at its own longest row.
"""

import contextlib
import json
import os
import sys

# The backend stub's interpreter ignores PYTHONPATH; honour it so the project's packages import.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from tpserve.triton_models.python_backend.cancelled_calls import answer_checked, serve_live  # noqa: E402
from tpserve.triton_models.python_backend.dlpack_io import input_array, output_tensor, through_dlpack  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort

        from tpserve.triton_models.python_backend.cancelled_calls import CancelledCalls
        from tpserve.triton_models.python_backend.cpu_threads import intra_op_threads

        self.cancelled = CancelledCalls.from_environment()  # calls nobody waits for are answered unrun

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = os.path.join(args["model_repository"], args["model_version"], params.get("artifact", "model.onnx"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads(params.get("intra_op_threads", "1"), config)
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input_names = [i["name"] for i in config["input"]]
        self.dlpack = {i["name"]: through_dlpack(i["data_type"]) for i in config["input"]}
        self.output_names = [o["name"] for o in config["output"]]
        from tpserve.triton_models.runtime.input_checks import PARAMETER, InputChecks

        self.checks = InputChecks.from_json(params.get(PARAMETER, ""))  # the spec's declaration, held per request
        self.batching = config.get("max_batch_size", 0) > 0
        self.ragged = all(i.get("allow_ragged_batch") and list(i["dims"]) == [-1] for i in config["input"])
        if self.ragged:
            from tpserve.triton_models.runtime import ragged

            self.grid = ragged.default_grid(4096, max(1, config.get("max_batch_size", 1)))
            self.per_token = [-1 in o["dims"] for o in config["output"]]
            self.mask = next((n for n in self.input_names if "mask" in n), "")

    def execute(self, requests):
        return serve_live(requests, self.cancelled, self._checked, pb_utils)

    def _checked(self, requests):
        """_execute for the requests whose inputs fit the model's declaration; each other one answered alone with
        why, before anything runs (the in-process paths' messages). Each request's inputs are read once."""
        return answer_checked(requests, self._feeds, self.checks, self.batching, self._execute, pb_utils)

    def _execute(self, requests, feeds):
        if self.ragged and len(feeds) > 1 and self._answer_ragged(requests, feeds):
            return None  # every request was answered through its response sender
        batched = self._run_batched(feeds)
        if batched is not None:
            return batched
        return [self._respond(self._run_one, f) for f in feeds]

    def _feeds(self, request):
        return {n: input_array(pb_utils, request, n, self.dlpack[n]) for n in self.input_names}

    def _run_batched(self, feeds):
        shapes = {tuple(f[n].shape[1:] for n in self.input_names) for f in feeds}
        if len(feeds) == 1 or len(shapes) != 1:
            return None
        merged = {n: np.concatenate([f[n] for f in feeds]) for n in self.input_names}
        try:
            outputs = self.session.run(self.output_names, merged)
        except Exception:
            return None  # retried per request, so only the bad one fails
        bounds = np.cumsum([f[self.input_names[0]].shape[0] for f in feeds])[:-1]
        per_request = zip(*[np.split(o, bounds) for o in outputs])
        return [self._response(parts) for parts in per_request]

    def _answer_ragged(self, requests, feeds) -> bool:
        """Rows of every length, grouped by length, shortest first; each request answered as soon as its rows
        have run (a short sentence does not wait for the batch's long ones). False, with nothing answered, where
        the batch cannot be pooled; a run that fails has the requests not yet answered run alone, so only a bad
        one fails."""
        from tpserve.triton_models.runtime import ragged

        try:
            batch = ragged.RaggedBatch(feeds, self.input_names, self.mask)
        except Exception:
            return False
        if 0 in batch.sizes:
            return False
        senders, answered = [r.get_response_sender() for r in requests], set()

        def answer(index, response):
            answered.add(index)
            senders[index].send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        run = lambda arrays: self.session.run(self.output_names, dict(zip(self.input_names, arrays)))  # noqa: E731
        try:
            ragged.run_answering(
                batch, self.grid, run, self.per_token, lambda i, parts: answer(i, self._response(parts))
            )
        except Exception:
            for index, feed in enumerate(feeds):
                if index not in answered:
                    with contextlib.suppress(Exception):  # a sender that fails (the client gone) loses only its own
                        answer(index, self._respond(self._run_one, feed))
        return True

    def _run_one(self, feed):
        return self.session.run(self.output_names, feed)

    def _respond(self, run, feed):
        try:
            return self._response(run(feed))
        except Exception as err:
            error = pb_utils.TritonError(f"onnxruntime failed: {err}", pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)

    def _response(self, outputs):
        # through DLPack: the stub's numpy-made outputs reach clients empty under numpy 2 (python_backend/dlpack_io)
        tensors = [output_tensor(pb_utils, n, o) for n, o in zip(self.output_names, outputs)]
        return pb_utils.InferenceResponse(output_tensors=tensors)
