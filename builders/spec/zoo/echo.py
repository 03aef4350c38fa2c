"""echo_<model>: a model that costs nothing, with another model's inputs and outputs.

Its output is the first values of its (preprocessed) input, so serving it through the same path as the real
engine (same backend, graphs, transport) measures what serving itself costs on a host: `gpu-bench` prints it
beside each served batch-1 point.
"""

from __future__ import annotations

import dataclasses
import math

from builders.spec.model_spec import ModelSpec


def spec_like(model: ModelSpec) -> ModelSpec:
    """The echo of model: its inputs, outputs and preprocessing; no labels, no weights."""
    return dataclasses.replace(model, name=f"echo_{model.name}", builder="echo", builder_args={}, labels=())


def build(model_spec: ModelSpec):
    return architecture(model_spec), {"weights": "none"}, None


def architecture(model_spec: ModelSpec):
    import torch

    width = math.prod(model_spec.outputs[0].dims)

    class Echo(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :width].float().contiguous()

    return Echo().eval()
