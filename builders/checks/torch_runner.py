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

    def __init__(self, module, input_metadata, output_names, name="pytorch"):
        super().__init__(name=name)
        self.module = module
        self.input_metadata = input_metadata
        self.output_names = list(output_names)

    def get_input_metadata_impl(self):
        return self.input_metadata

    def infer_impl(self, feed_dict):
        import torch

        with torch.no_grad():
            start = time.perf_counter()
            outputs = self.module(*[torch.from_numpy(v) for v in feed_dict.values()])
            self.inference_time = time.perf_counter() - start
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return OrderedDict((n, o.detach().cpu().numpy()) for n, o in zip(self.output_names, outputs))
