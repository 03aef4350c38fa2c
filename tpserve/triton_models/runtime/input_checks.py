"""A request's inputs held to the model's own declaration, with one message per fault, the same on every backend
and both protocols: values inside an integer input's value_range, every named axis within its declared lengths,
inputs that share an axis of one length. The builders write the declaration into the model's config (parameter
input_checks, JSON; builders/repository/writer.py); the Python-backend models and the in-process paths check each
request against it before anything runs, and a request that fails is answered alone with why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

PARAMETER = "input_checks"


@dataclass(frozen=True)
class InputChecks:
    """ranges: input -> (low, high) of its values (integers); axes: input -> the axis name of each dim (after the
    batch axis; None where the dim is fixed); lengths: axis -> (shortest, longest or None)."""

    ranges: dict = field(default_factory=dict)
    axes: dict = field(default_factory=dict)
    lengths: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"ranges": self.ranges, "axes": self.axes, "lengths": self.lengths}, sort_keys=True)

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
        )
        return found if found.ranges or found.lengths else None

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
            bounds = self.ranges.get(name)
            if bounds is not None and array.size and np.issubdtype(array.dtype, np.integer):
                low, high = bounds
                if int(array.min()) < low or int(array.max()) >= high:
                    return f"input {name}: values must lie in [{low}, {high}) (the model's value_range)"
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
