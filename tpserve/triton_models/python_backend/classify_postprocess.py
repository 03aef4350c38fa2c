"""Triton Python-backend model: the postprocess step of a classifier pipeline.

Input LOGITS (float32, classes). Outputs per sample: CLASS_IDS (int64, k), SCORES (softmax
probabilities, float32, k), LABELS (bytes, k) from labels.txt beside config.pbtxt.
Parameter: top_k.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.top_k = int(params.get("top_k", "5"))
        with open(os.path.join(args["model_repository"], "labels.txt")) as handle:
            self.labels = np.array([line.rstrip("\n").encode() for line in handle], dtype=object)

    def execute(self, requests):
        return [self._respond(pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy()) for r in requests]

    def _respond(self, logits):
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = shifted / shifted.sum(axis=1, keepdims=True)
        ids = np.argsort(-probs, axis=1)[:, : self.top_k]
        scores = np.take_along_axis(probs, ids, axis=1).astype(np.float32)
        tensors = [
            pb_utils.Tensor("CLASS_IDS", ids.astype(np.int64)),
            pb_utils.Tensor("SCORES", scores),
            pb_utils.Tensor("LABELS", self.labels[ids]),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)
