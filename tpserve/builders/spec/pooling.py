"""Pooling inside the engine: a sentence encoder's token embeddings reduced to one normalized vector per row.

Mean pooling over the real tokens (the attention mask), then L2 normalization: what sentence-transformers'
Pooling(mode="mean") + Normalize compute. It is part of the exported program, so it runs inside the compiled
graph (fp32 accumulation whatever the engine's precision) and the server returns [rows, hidden] instead of
[rows, length, hidden].
"""

from __future__ import annotations

from tpserve.common.errors import SpecError

POOLINGS = ("", "mean")


def mask_index(spec) -> int:
    """The position of the attention-mask input (the input named like '*mask*') among the spec's inputs."""
    found = [i for i, t in enumerate(spec.inputs) if "mask" in t.name]
    if len(found) != 1:
        raise SpecError(
            f"model {spec.name!r}: pooling = {spec.pooling!r} needs exactly one input named like '*mask*' (the "
            f"attention mask), the inputs are {[t.name for t in spec.inputs]}; rename the mask input"
        )
    return found[0]


def token_embeddings(out):
    """The token embeddings of an encoder's output: a tensor, the first of a tuple, or last_hidden_state."""
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def mean_pooled(module, spec):
    """module (token embeddings out) wrapped to return the mean-pooled, L2-normalized embedding."""
    import torch
    from torch.nn import functional

    at = mask_index(spec)

    class MeanPooled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *inputs):
            tokens = token_embeddings(self.inner(*inputs)).float()
            mask = inputs[at].unsqueeze(-1).to(tokens.dtype)
            mean = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return functional.normalize(mean, p=2, dim=1)

    return MeanPooled(module).eval()


def pooled(module, spec):
    """The module as the spec asks: pooled when spec.pooling says so, else as it is."""
    return mean_pooled(module, spec) if spec.pooling == "mean" else module
