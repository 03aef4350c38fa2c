"""A request's inputs held to the model's own declaration, with one message per fault, the same on every backend
and both protocols: values inside an input's value_range, floats finite where declared, every named axis within its
declared lengths, inputs that share an axis of one length. The builders write the declaration into the model's
config (parameter input_checks, JSON; builders/repository/writer.py); the Python-backend models and the in-process
paths check each request against it before anything runs, and a request that fails is answered alone with why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

PARAMETER = "input_checks"


@dataclass(frozen=True)
class InputChecks:
    """ranges: input -> (low, high) of its values (integers in [low, high), floats in [low, high]); axes: input ->
    the axis name of each dim (after the batch axis; None where the dim is fixed); lengths: axis -> (shortest,
    longest or None)."""

    ranges: dict = field(default_factory=dict)
    axes: dict = field(default_factory=dict)
    lengths: dict = field(default_factory=dict)
    finite: list = field(default_factory=list)  # float inputs whose values must be finite (no NaN, no infinity)

    def to_json(self) -> str:
        found = {"ranges": self.ranges, "axes": self.axes, "lengths": self.lengths, "finite": self.finite}
        return json.dumps(found, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> InputChecks | None:
        """The checks of a config's parameter (None: no parameter, or nothing to check)."""
        if not text:
            return None
        data = json.loads(text)
        found = cls(
            {k: tuple(v) for k, v in data.get("ranges", {}).items()},
            {k: list(v) for k, v in data.get("axes", {}).items()},
            {k: tuple(v) for k, v in data.get("lengths", {}).items()},
            list(data.get("finite", [])),
        )
        return found if found.ranges or found.lengths or found.finite else None

    def why_not(self, feed: dict, batched: bool = True) -> str | None:
        """Why this request's inputs (name -> array, the batch axis first where batched) do not fit, or None.
        Token inputs (one axis per row) hear the in-process paths' words (inprocess/ragged_path.py)."""
        seen: dict[str, tuple[str, int]] = {}  # axis -> (the first input that had it, its length)
        for name, array in feed.items():
            dims = array.shape[1:] if batched else array.shape
            for position, axis in enumerate(self.axes.get(name, [])):
                if axis is None or position >= len(dims):
                    continue
                why = self._length_fault(name, axis, int(dims[position]), len(dims) == 1)
                if why:
                    return why
                if axis in seen and seen[axis][1] != int(dims[position]):
                    return self._shared_fault(feed, seen[axis][0], name, axis)
                seen.setdefault(axis, (name, int(dims[position])))
            if name in self.finite and array.size:  # before the range: NaN is what is wrong, not where it lies
                row = _nonfinite_row(array, batched)
                if row is not None:
                    where = f": row {row}" if batched else ""
                    return f"input {name}: values must be finite (the model declares it: no NaN or infinity){where}"
            bounds = self.ranges.get(name)
            if bounds is not None and array.size:
                why = _range_fault(name, array, bounds, batched)
                if why:
                    return why
        return None

    def _length_fault(self, name: str, axis: str, length: int, tokens: bool) -> str | None:
        shortest, longest = self.lengths.get(axis, (1, None))
        if tokens and longest is not None and length > longest:
            return (
                f"{name}: {length} tokens per row exceed the model's longest length {longest}; "
                f"truncate to {longest} tokens"
            )
        if length < shortest or (longest is not None and length > longest):
            most = "" if longest is None else f"..{longest}"
            return f"input {name}: axis '{axis}' has length {length}; the model takes {shortest}{most}"
        return None

    @staticmethod
    def _shared_fault(feed: dict, first: str, name: str, axis: str) -> str:
        a, b = feed[first].shape, feed[name].shape
        if len(a) == len(b):
            return f"the inputs of one request must have one shape: {first} {list(a)}, {name} {list(b)}"
        return f"inputs {first} and {name} share axis '{axis}' but have shapes {list(a)} and {list(b)}"


def holds_floats(text: str) -> bool:
    """Whether a config's checks (its input_checks parameter) hold float values: an input declared finite or given
    a float range. The native paths read shapes and integers only, so such a model is served on the general path,
    where every check is held."""
    checks = InputChecks.from_json(text)
    if checks is None:
        return False
    return bool(checks.finite) or any(isinstance(low, float) for low, _ in checks.ranges.values())


def _range_fault(name: str, array, bounds, batched: bool) -> str | None:
    """Integers must lie in [low, high) and floats in [low, high] (NaN lies in no range): why not, naming the
    first row at fault, or None."""
    low, high = bounds
    if np.issubdtype(array.dtype, np.integer):
        if int(array.min()) >= low and int(array.max()) < high:
            return None
        outside = lambda v: (v < low) | (v >= high)  # noqa: E731
        span = f"[{low}, {high})"
    elif np.issubdtype(array.dtype, np.floating):
        least, most = float(array.min()), float(array.max())
        if least >= low and most <= high:  # False for NaN: the rows are read below
            return None
        outside = lambda v: ~((v >= low) & (v <= high))  # noqa: E731
        span = f"[{_number(low)}, {_number(high)}]"
    else:
        return None
    row = _first_row(array, outside)
    if row is None:
        return None
    where = f": row {row}" if batched else ""
    return f"input {name}: values must lie in {span} (the model's value_range){where}"


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _first_row(array, bad) -> int | None:
    """The first row (the batch axis first) where bad(values) holds anywhere, or None. A torch tensor (the torch
    model's view, python_backend/torch_model.py) is read where it is."""
    tensor = getattr(array, "tensor", None)
    values = tensor if tensor is not None else np.asarray(array)
    flat = values.reshape(values.shape[0], -1) if len(values.shape) else values.reshape(1, -1)
    marked = bad(flat)
    rows = marked.any(dim=1).nonzero()[:, 0].tolist() if tensor is not None else np.flatnonzero(marked.any(axis=1))
    return int(rows[0]) if len(rows) else None


def _nonfinite_row(array, batched: bool) -> int | None:
    """The first row holding NaN or an infinity (0 where not batched), or None."""
    tensor = getattr(array, "tensor", None)
    if tensor is not None:
        import torch

        if not tensor.is_floating_point():
            return None
        row = _first_row(array, lambda v: ~torch.isfinite(v))
    else:
        if np.asarray(array).dtype.kind != "f":
            return None
        row = _first_row(array, lambda v: ~np.isfinite(v))
    return None if row is None else (row if batched else 0)


class TorchView:
    """A torch tensor seen as InputChecks reads an array (shape, size, dtype; min, max and finiteness read where the
    tensor lies, only where a check asks): the torch runtime's models and the in-process backend's general path."""

    def __init__(self, tensor):
        self.tensor, self.shape, self.size = tensor, tuple(tensor.shape), tensor.numel()
        try:
            self.dtype = np.dtype(str(tensor.dtype).removeprefix("torch."))
        except TypeError:  # bfloat16 and others numpy lacks: floats, never range-checked
            self.dtype = np.dtype(np.float32)

    def min(self):
        return self.tensor.min().item()

    def max(self):
        return self.tensor.max().item()


def torch_views(names, tensors) -> dict:
    """Each input as InputChecks reads it, the tensor left where it is."""
    return {name: TorchView(tensor) for name, tensor in zip(names, tensors)}
