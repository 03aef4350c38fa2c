"""echo_<model>: a model that costs nothing, with another model's inputs and outputs.

Its output is the first values of its (preprocessed) input, so serving it through the same path as the real
engine (same backend, graphs, transport) measures what serving itself costs on a host: `gpu-bench` and
`text-bench` print it beside each served batch-1 point. A sequence model's echo (inputs [rows, tokens]) answers each
row's first token id, repeated to fill a pooled output ([rows, hidden]) or a per-token one ([rows, tokens, hidden]).
"""

from __future__ import annotations

import dataclasses
import math

from tpserve.builders.spec.model_spec import ModelSpec


def spec_like(model: ModelSpec) -> ModelSpec:
    """The echo of model: its inputs, outputs and preprocessing; no labels, no weights."""
    return dataclasses.replace(model, name=f"echo_{model.name}", builder="echo", builder_args={}, labels=())


def build(model_spec: ModelSpec):
    return architecture(model_spec), {"weights": "none"}, None


def architecture(model_spec: ModelSpec):
    import torch

    if _sequence(model_spec):
        return _sequence_echo(model_spec)
    width = math.prod(model_spec.outputs[0].dims)

    class Echo(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :width].float().contiguous()

    return Echo().eval()


def _sequence(model_spec: ModelSpec) -> bool:
    """Every input one token axis per row ([-1]): the ragged path's models."""
    return all(tuple(i.dims) == (-1,) for i in model_spec.inputs)


def _sequence_echo(model_spec: ModelSpec):
    import torch

    shapes = [tuple(o.dims) for o in model_spec.outputs]

    class SequenceEcho(torch.nn.Module):
        def forward(self, *inputs):
            first = inputs[0][:, :1].float()  # [rows, 1]
            outs = []
            for dims in shapes:
                if dims and dims[0] == -1:  # per token: [rows, tokens, inner]
                    inner = math.prod(dims[1:])
                    tokens = inputs[0].float().unsqueeze(-1)
                    outs.append(tokens.expand(-1, -1, inner).reshape(*inputs[0].shape, *dims[1:]).contiguous())
                else:
                    outs.append(first.expand(-1, math.prod(dims)).reshape(-1, *dims).contiguous())
            return outs[0] if len(outs) == 1 else tuple(outs)

    return SequenceEcho().eval()
