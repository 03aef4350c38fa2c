"""Users' own models: a module from an importable factory (and a checkpoint), or a torch.export program.

The spec file (builders/spec/spec_file.py) turns each `[[model]]` into a ModelSpec whose builder
is one of USER_BUILDERS and whose builder_args say where the model comes from. The build
then treats it like a zoo model: export, validate, quantize, serve. Every failure here is a
SpecError naming the spec file, the model and the field, and saying how to fix it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import SpecError

FACTORY, EXPORTED, ONNX = "user_factory", "user_exported", "user_onnx"
USER_BUILDERS = (FACTORY, EXPORTED, ONNX)


def where(spec: ModelSpec) -> str:
    """'<spec file>, model <name>': the prefix of every error about a user model."""
    return f"{spec.builder_args.get('spec_file', '<spec>')}, model {spec.name!r}"


def source_hash(spec: ModelSpec) -> str:
    """sha256 of this module and of the file that defines a factory (so editing the model rebuilds it).

    Checkpoints and exported/ONNX files are hashed in the spec's builder_args already.
    """
    import hashlib
    import importlib.util

    parts = [Path(__file__).read_bytes()]
    factory = spec.builder_args.get("factory")
    if factory:
        with _on_path(spec.builder_args.get("python_path", ())):
            try:
                found = importlib.util.find_spec(factory.partition(":")[0])
            except (ImportError, ValueError):
                found = None
        if found is not None and found.origin and Path(found.origin).is_file():
            parts.append(Path(found.origin).read_bytes())
    return hashlib.sha256(b"|".join(parts)).hexdigest()


def build(spec: ModelSpec):
    """The torch module of a user model, checked against the spec's inputs and outputs.

    Returns:
        (module in eval mode, metrics, sample data) as the zoo builders do.
    """
    from tpserve.builders.spec.pooling import pooled

    if spec.builder == FACTORY:
        module = _from_factory(spec)
    elif spec.builder == EXPORTED:
        module = _from_exported(spec)
    else:
        raise SpecError(f"{where(spec)}: an ONNX model has no torch module (it is imported, not exported)")
    module = check_against_spec(pooled(module, spec), spec)
    return module, {}, None


def _from_factory(spec: ModelSpec):
    import torch

    args = spec.builder_args
    factory = _import_factory(args["factory"], args.get("python_path", ()), spec)
    try:
        module = factory(**args.get("factory_args", {}))
    except Exception as err:  # the user's code may raise anything
        raise SpecError(
            f"{where(spec)}: factory {args['factory']!r} raised {type(err).__name__}: {err}; "
            "check factory_args against the factory's parameters"
        ) from err
    if not isinstance(module, torch.nn.Module):
        raise SpecError(
            f"{where(spec)}: factory {args['factory']!r} returned {type(module).__name__}, not a torch.nn.Module"
        )
    if args.get("checkpoint"):
        load_checkpoint(module, Path(args["checkpoint"]), spec)
    return _eval(module)


@contextlib.contextmanager
def _on_path(folders):
    added = [str(f) for f in folders if str(f) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for folder in added:
            sys.path.remove(folder)


def _import_factory(target: str, python_path, spec: ModelSpec):
    module_name, _, attr = target.partition(":")
    with _on_path(python_path):
        try:
            obj = importlib.import_module(module_name)
        except Exception as err:  # ImportError, or whatever the user's module raises on import
            raise SpecError(
                f"{where(spec)}: factory {target!r}: cannot import {module_name!r} ({type(err).__name__}: {err}); "
                "install the package, or list the folder that holds it in python_path"
            ) from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"{where(spec)}: factory {target!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"{where(spec)}: factory {target!r} is not callable")
    return obj


def load_checkpoint(module, path: Path, spec: ModelSpec) -> None:
    """Load a state_dict (torch.load with weights_only=True) into module, strictly.

    Raises:
        SpecError: unreadable file, not a state_dict, missing/unexpected keys or wrong shapes.
    """
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle errors, weights_only refusals, truncated files
        raise SpecError(
            f"{where(spec)}: checkpoint {path} could not be loaded with weights_only=True ({err}); "
            "save it with torch.save(module.state_dict(), path)"
        ) from err
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecError(f"{where(spec)}: checkpoint {path} holds no state_dict (a dict of tensors)")
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches
        raise SpecError(f"{where(spec)}: checkpoint {path} does not fit the module: {err}") from err
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if missing or unexpected:
        raise SpecError(
            f"{where(spec)}: checkpoint {path} does not fit the module built by {spec.builder_args['factory']!r}: "
            f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}, unexpected keys "
            f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}; check factory_args or the checkpoint"
        )


def _from_exported(spec: ModelSpec):
    import torch

    path = Path(spec.builder_args["exported"])
    try:
        program = torch.export.load(str(path))
    except Exception as err:  # torch raises many types on a bad archive
        raise SpecError(
            f"{where(spec)}: exported program {path} could not be loaded ({type(err).__name__}: {err}); "
            "write it with torch.export.save(torch.export.export(module, args), path)"
        ) from err
    return program.module()


def _eval(module):
    try:
        return module.eval()
    except NotImplementedError:  # exported modules refuse eval(); they are already traced in eval mode
        return module


def _ordered_outputs(module, spec: ModelSpec):
    """A module whose forward returns a dict (e.g. a ModelOutput) becomes one returning a tuple in the spec's order."""
    import torch

    names = [t.name for t in spec.outputs]

    class Ordered(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            out = self.inner(*args)
            missing = [n for n in names if n not in out]
            if missing:
                raise KeyError(f"the module's output dict has no {missing} (keys: {list(out)})")
            return tuple(out[n] for n in names)

    return _eval(Ordered(module))


def outputs_as_list(out) -> list:
    """A module's result as a list of tensors (one tensor, a tuple or a list)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_against_spec(module, spec: ModelSpec):
    """Run the module on inputs shaped like the spec; its outputs must match the spec's outputs.

    Returns:
        The module, wrapped to return a tuple in the spec's order where it returns a dict.

    Raises:
        SpecError: the module fails on the spec's inputs, or returns other outputs than the spec says.
    """
    import torch

    from tpserve.builders.formats.export import sample_inputs

    feeds = sample_inputs(spec, batch=2)
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    try:
        with torch.no_grad():
            out = module(*[torch.from_numpy(v) for v in feeds.values()])
            if isinstance(out, dict):
                module = _ordered_outputs(module, spec)
                out = module(*[torch.from_numpy(v) for v in feeds.values()])
        out = outputs_as_list(out)
    except Exception as err:  # whatever the user's forward() raises
        _raise_for_unranged_integers(module, spec, feeds, err)
        raise SpecError(
            f"{where(spec)}: the module failed on inputs shaped like the spec's inputs {shapes} "
            f"({type(err).__name__}: {err}); inputs are passed to forward() positionally, in the spec's order: "
            "fix the spec's inputs (names, order, dtype, dims)"
        ) from err
    if len(out) != len(spec.outputs):
        raise SpecError(
            f"{where(spec)}: the module returned {len(out)} output(s), the spec lists {len(spec.outputs)} "
            f"({[t.name for t in spec.outputs]}); list one output per returned tensor, in order"
        )
    for i, (tensor, want) in enumerate(zip(out, spec.outputs)):
        _check_output(i, tensor, want, spec)
    return module


DEFAULT_HIGH = 100  # generated integers without a value_range are drawn from [0, 100) (export.random_values)


def _unranged_integers(spec: ModelSpec) -> list[str]:
    import numpy as np

    return [t.name for t in spec.inputs if t.value_range is None and np.dtype(t.numpy_dtype).kind in "iu"]


def _accepts(module, feeds: dict, name: str, value: int) -> bool:
    """Whether the module runs with input `name` filled with `value` (other integer inputs at 0)."""
    import numpy as np
    import torch

    trial = {
        k: (np.full_like(v, value) if k == name else np.zeros_like(v) if v.dtype.kind in "iu" else v)
        for k, v in feeds.items()
    }
    try:
        with torch.no_grad():
            module(*[torch.from_numpy(v) for v in trial.values()])
    except Exception:  # the user's forward() on a probe value
        return False
    return True


def _largest_accepted(module, feeds: dict, name: str) -> int | None:
    """The largest value in [0, DEFAULT_HIGH) the module accepts in `name` (binary search), or None."""
    if not _accepts(module, feeds, name, 0):
        return None
    low, high = 0, DEFAULT_HIGH - 1  # low accepted; is anything above it?
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if _accepts(module, feeds, name, mid) else (low, mid - 1)
    return low


def _raise_for_unranged_integers(module, spec: ModelSpec, feeds: dict, err: Exception) -> None:
    """Where integer inputs have no value_range and the module failed (typically an embedding lookup
    past its size), name the input and the value_range that works, found by probing the module."""
    names = _unranged_integers(spec)
    if not names:
        return
    hints = []
    for name in names:
        top = _largest_accepted(module, feeds, name)
        if top is not None and top < DEFAULT_HIGH - 1:
            hints.append(f"inputs '{name}' accepts values 0..{top}: add value_range = [0, {top + 1}] (high excluded)")
    if not hints:
        return
    raise SpecError(
        f"{where(spec)}: the module failed on generated data ({type(err).__name__}: {err}); integer inputs "
        f"{names} have no value_range, so their values were drawn from [0, {DEFAULT_HIGH}). Probed: "
        + "; ".join(hints)
        + " to that input in the spec"
    ) from err


def _check_output(i: int, tensor, want, spec: ModelSpec) -> None:
    import torch

    got = list(tensor.shape)
    dims_ok = len(got) == len(want.dims) + 1 and got[0] == 2
    dims_ok = dims_ok and all(w == -1 or g == w for w, g in zip(want.dims, got[1:]))
    dtype = str(tensor.dtype).replace("torch.", "") if isinstance(tensor, torch.Tensor) else type(tensor).__name__
    if not dims_ok or dtype != want.numpy_dtype:
        raise SpecError(
            f"{where(spec)}: outputs[{i}] ({want.name!r}): the module returned shape {got} of {dtype} for a batch "
            f"of 2, the spec says dims {list(want.dims)} ({want.dtype}, after the batch axis); fix outputs[{i}]"
        )
