"""Triton Python-backend model: mean pooling + L2 normalization (the last step of a text pipeline).

Inputs token_embeddings (float32, seq x hidden) and attention_mask (int64, seq); output
EMBEDDING (float32, hidden), as sentence-transformers computes it.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [self._respond(r) for r in requests]

    def _respond(self, request):
        tokens = pb_utils.get_input_tensor_by_name(request, "token_embeddings").as_numpy()
        mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy().astype(np.float32)[..., None]
        mean = (tokens * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        norm = np.linalg.norm(mean, axis=1, keepdims=True)
        embedding = (mean / np.clip(norm, 1e-12, None)).astype(np.float32)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", embedding)])
