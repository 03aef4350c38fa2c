"""Triton Python-backend model: the tokenize step of a text pipeline.

Input TEXT (TYPE_STRING, one per sample); outputs the encoder's ids and mask (int64, each request padded to
its own longest text). The config batches requests dynamically: the texts of every request in a batch are
decoded together and tokenized in one Rust `encode_batch` call (triton_models/runtime/tokenize_core.py).
tokenizer.json sits in the version folder. Parameter: max_length. An empty, whitespace-only or non-UTF-8
text gets INVALID_ARG for its request alone, naming this step. Outputs leave through DLPack (config parameter
dlpack_outputs): the embedded server's stub, built for numpy 1, sends arrays it is handed directly empty under
numpy 2. (Under numpy 2 the stub cannot read BYTES either: serve the step in-process there,
triton_models/inprocess/tokenize_serving.py.)
"""

import json
import os
import sys

# The backend stub's interpreter ignores PYTHONPATH; honour it so the project's packages import.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import torch  # noqa: E402  (outputs leave as torch tensors through DLPack)
import triton_python_backend_utils as pb_utils  # noqa: E402

from tpserve.triton_models.runtime.tokenize_core import load_tokenizer, tokenize  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = load_tokenizer(os.path.join(folder, "tokenizer.json"), int(params.get("max_length", "256")))
        self.names = [o["name"] for o in config["output"]]  # ids, then mask: the encoder's input names

    def execute(self, requests):
        texts = [pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy().reshape(-1) for r in requests]
        return [self._response(result) for result in tokenize(self.tokenizer, texts)]

    def _response(self, result):
        if isinstance(result, Exception):
            error = pb_utils.TritonError(str(result), pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        tensors = [pb_utils.Tensor.from_dlpack(n, torch.from_numpy(a)) for n, a in zip(self.names, result)]
        return pb_utils.InferenceResponse(output_tensors=tensors)
