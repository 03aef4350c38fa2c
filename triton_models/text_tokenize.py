"""Triton Python-backend model: the tokenize step of a text pipeline.

Input TEXT (TYPE_STRING, one per sample); outputs input_ids and attention_mask (int64,
padded to the longest text of the request). tokenizer.json sits in the version folder.
Parameter: max_length. An empty or whitespace-only text gets INVALID_ARG naming this step.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

STEP = "tokenize"


class TritonPythonModel:
    def initialize(self, args):
        from tokenizers import Tokenizer

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.enable_truncation(int(params.get("max_length", "256")))
        self.tokenizer.enable_padding()

    def execute(self, requests):
        return [self._respond(pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()) for r in requests]

    def _respond(self, texts):
        try:
            decoded = [self._text(i, t) for i, t in enumerate(texts.reshape(-1))]
        except ValueError as err:
            error = pb_utils.TritonError(f"{STEP}: {err}", pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        encodings = self.tokenizer.encode_batch(decoded)
        ids = np.array([e.ids for e in encodings], np.int64)
        mask = np.array([e.attention_mask for e in encodings], np.int64)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]
        )

    @staticmethod
    def _text(index, raw):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError as err:
            raise ValueError(f"text {index} is not valid UTF-8 ({err})") from None
        if not text.strip():
            raise ValueError(f"text {index} is empty or whitespace only")
        return text
