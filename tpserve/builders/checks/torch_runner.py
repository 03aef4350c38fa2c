"""A Polygraphy runner around a torch module, for PyTorch-as-reference comparisons.

Polygraphy's own PytRunner moves inputs to CUDA and expects a tuple of outputs; this one
runs where the module lives (the CPU here) and names single or multiple outputs alike.
Import it lazily: it imports Polygraphy.
"""

import time
from collections import OrderedDict

from polygraphy.backend.base import BaseRunner


class TorchFunctionRunner(BaseRunner):
    """Runs a torch module (any Python function of tensors) on numpy feeds."""

    def __init__(self, module, input_metadata, output_names, name="pytorch", mask=None, per_token=()):
        """mask: the input that marks real tokens; per-token outputs (per_token, one flag an output) are then
        compared at real tokens only: their padded positions carry no meaning, and an engine that runs each row
        at its own length leaves them zero."""
        super().__init__(name=name)
        self.module = module
        self.input_metadata = input_metadata
        self.output_names = list(output_names)
        self.mask, self.per_token = mask, list(per_token)

    def get_input_metadata_impl(self):
        return self.input_metadata

    def infer_impl(self, feed_dict):
        import torch

        with torch.no_grad():
            start = time.perf_counter()
            outputs = self.module(*[torch.from_numpy(v) for v in feed_dict.values()])
            self.inference_time = time.perf_counter() - start
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        arrays = [o.detach().cpu().numpy() for o in outputs]
        if self.mask is not None:
            real = feed_dict[self.mask]
            arrays = [
                a * real.reshape(real.shape + (1,) * (a.ndim - real.ndim)).astype(a.dtype) if token else a
                for a, token in zip(arrays, self.per_token + [False] * len(arrays))
            ]
        return OrderedDict(zip(self.output_names, arrays))
