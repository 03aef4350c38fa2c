"""Export a torch module to ONNX with a dynamic batch axis, checked and shape-inferred."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
from tpserve.common.errors import ExportError

STAMP = "export.json"


@dataclass(frozen=True)
class ExportResult:
    """Where the ONNX model is, its sha256, and whether it was reused from an earlier build."""

    path: Path
    sha256: str
    reused: bool
    metrics: dict


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_stamp(out_dir: Path) -> dict | None:
    """The stamp an earlier export left in out_dir, or None."""
    try:
        return json.loads((out_dir / STAMP).read_text())
    except (OSError, ValueError):
        return None


def up_to_date(out_dir: Path, build_hash: str) -> ExportResult | None:
    """The earlier export in out_dir if it was made from the same inputs and is intact."""
    stamp = read_stamp(out_dir)
    path = out_dir / "model.onnx"
    if not stamp or stamp.get("build_hash") != build_hash or not path.exists():
        return None
    if file_sha256(path) != stamp.get("sha256"):
        return None
    return ExportResult(path, stamp["sha256"], reused=True, metrics=stamp.get("metrics", {}))


def sample_inputs(spec: ModelSpec, batch: int, seed: int = 0, lengths: dict | None = None) -> dict:
    """Random inputs (numpy) for every input of the spec.

    Args:
        lengths: axis name -> length for the dynamic axes; others get spec.sample_length(axis).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    return {t.name: random_values(rng, t, sample_shape(spec, t, batch, lengths)) for t in spec.inputs}


def sample_shape(spec: ModelSpec, tensor: TensorSpec, batch: int, lengths: dict | None = None) -> tuple:
    """(batch, dims...) of generated data for one input: dynamic axes take lengths[axis] or spec.sample_length."""
    named, lengths = tensor.dynamic_axes(), lengths or {}
    dims = [
        lengths.get(named[i]) or spec.sample_length(named[i]) if i in named else d
        for i, d in enumerate(tensor.dims, start=1)
    ]
    return (batch, *dims)


def random_values(rng, tensor: TensorSpec, shape: tuple):
    """Random values of a tensor's dtype within its value_range (see TensorSpec)."""
    import numpy as np

    dtype = np.dtype(tensor.numpy_dtype)
    if tensor.is_mask and len(shape) >= 2:  # each row: a prefix of ones (at least one real token), then zeros
        width = shape[-1]
        real = rng.integers(1, width + 1, shape[:-1]) if width else np.zeros(shape[:-1], np.int64)
        return (np.arange(width) < real[..., None]).astype(dtype)
    low, high = tensor.value_range or (None, None)
    if dtype.kind == "f":
        values = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
        return values.astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    low, high = (0, 100) if low is None or high is None else (int(low), int(high))
    return rng.integers(low, high, shape).astype(dtype)


def dynamic_shapes(spec: ModelSpec) -> dict:
    import torch

    batch = torch.export.Dim("batch", min=1, max=max(spec.max_batch_size, 2))
    axes: dict = {}  # one torch Dim per axis name: inputs that share a name share the length
    for tensor in spec.inputs:
        for name in tensor.axes:
            low, high = spec.axis_range(name)
            axes.setdefault(
                name, torch.export.Dim(name, min=low, max=high) if high else torch.export.Dim(name, min=low)
            )
    shapes = {}
    for tensor in spec.inputs:
        shapes[tensor.name] = {0: batch, **{i: axes[n] for i, n in tensor.dynamic_axes().items()}}
    return shapes


def shapes_for(module, spec: ModelSpec):
    """dynamic_shapes in the structure of the module's forward(): one entry per parameter, or one
    tuple for a forward(*args)."""
    import inspect

    shapes = tuple(dynamic_shapes(spec).values())
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return shapes
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return (shapes,)
    return shapes


def export_onnx(module, spec: ModelSpec, out_dir: Path, build_hash: str, metrics: dict | None = None) -> ExportResult:
    """Export module to out_dir/model.onnx, check it, and stamp it with build_hash.

    The file is written under a temporary name and renamed only once checked, so an
    interrupted export never leaves a model.onnx behind that looks complete.

    Raises:
        ExportError: torch could not export the module, or the ONNX checker refused it.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    final, partial = out_dir / "model.onnx", out_dir / "model.onnx.partial"
    example = sample_inputs(spec, batch=2)
    try:
        _torch_export(module, spec, example, partial)
        name_outputs(partial, [t.name for t in spec.outputs])
        check_and_infer(partial, spec)
    except ExportError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, final)
    sha = file_sha256(final)
    stamp = {"build_hash": build_hash, "sha256": sha, "metrics": metrics or {}}
    (out_dir / STAMP).write_text(json.dumps(stamp, indent=2))
    return ExportResult(final, sha, reused=False, metrics=metrics or {})


LOG_NAME = "tpserve.builders.export"  # at DEBUG (the builder CLI's -v) the exporter's warnings show


@contextlib.contextmanager
def exporter_output():
    """Hide the exporter's warnings and log lines unless the LOG_NAME logger is at DEBUG (a user rarely can act
    on them); errors still raise."""
    import logging

    if logging.getLogger(LOG_NAME).isEnabledFor(logging.DEBUG):
        yield
        return

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_log = logging.getLogger("torch")
        level = torch_log.level
        torch_log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            torch_log.setLevel(level)


def _torch_export(module, spec: ModelSpec, example: dict, path: Path) -> None:
    import torch

    args = tuple(torch.from_numpy(example[t.name]) for t in spec.inputs)
    kwargs: dict[str, Any] = dict(
        input_names=[t.name for t in spec.inputs],
        opset_version=spec.opset,
        dynamo=True,
        external_data=False,
        verbose=False,
    )
    shapes = shapes_for(module, spec)  # positional, like args
    try:
        with torch.no_grad(), exporter_output():
            torch.onnx.export(module, args, str(path), dynamic_shapes=shapes, **kwargs)
    except Exception as err:  # torch raises many unrelated types here
        raise ExportError(f"model {spec.name!r}: torch.onnx.export failed: {err}") from err


def name_outputs(path: Path, names: list[str]) -> None:
    """Give the graph's outputs the spec's names, renaming internal values that already use one.

    The exporter's own output renaming can clash with an internal value of the same name (an
    output called "embedding" beside an aten.embedding node), which breaks SSA form.
    """
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    current = [o.name for o in graph.output]
    if len(current) != len(names):
        return  # _check_io reports the count mismatch
    taken = {v for node in graph.node for v in node.output} | {i.name for i in graph.input}
    clashes = {n: f"{n}__internal" for n in names if n in taken and n not in current}
    _rename(graph, clashes)
    _rename(graph, {old: new for old, new in zip(current, names) if old != new})
    onnx.save(model, str(path))


def _rename(graph, mapping: dict) -> None:
    if not mapping:
        return
    for node in graph.node:
        node.input[:] = [mapping.get(v, v) for v in node.input]
        node.output[:] = [mapping.get(v, v) for v in node.output]
    for value in list(graph.output) + list(graph.value_info):
        value.name = mapping.get(value.name, value.name)


def check_and_infer(path: Path, spec: ModelSpec) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
        model = onnx.shape_inference.infer_shapes(onnx.load(str(path)), strict_mode=True)
    except Exception as err:  # onnx raises ValidationError, InferenceError, ...
        raise ExportError(f"model {spec.name!r}: the exported ONNX model is invalid: {err}") from err
    _check_io(model, spec)
    onnx.save(model, str(path))
    _check_dims(path, spec)


def _check_io(model, spec: ModelSpec) -> None:
    got = {
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
    }
    want = {"inputs": [t.name for t in spec.inputs], "outputs": [t.name for t in spec.outputs]}
    if got != want:
        raise ExportError(
            f"model {spec.name!r}: exported tensor names {got} differ from the spec {want}; "
            "make the module's forward() take and return tensors in the spec's order"
        )


def _check_dims(path: Path, spec: ModelSpec) -> None:
    dims = onnx_tensor_dims(path)
    for tensor in spec.inputs + spec.outputs:
        if not tensor_spec_matches(tensor, dims[tensor.name]):
            raise ExportError(
                f"model {spec.name!r}: tensor {tensor.name!r} exported with dims {dims[tensor.name]}, "
                f"expected a dynamic batch axis then {list(tensor.dims)}; check the spec's dims"
            )


def onnx_tensor_dims(path: Path) -> dict[str, list]:
    """Per tensor of the graph's inputs and outputs, its dims (ints or symbolic names)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    dims = {}
    for value in list(model.graph.input) + list(model.graph.output):
        shape = value.type.tensor_type.shape.dim
        dims[value.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in shape]
    return dims


def tensor_spec_matches(tensor: TensorSpec, dims: list) -> bool:
    """Whether an ONNX tensor's dims (batch first) agree with a per-sample TensorSpec."""
    if len(dims) != len(tensor.dims) + 1 or isinstance(dims[0], int) and dims[0] > 0:
        return False
    return all(want == -1 or got == want for want, got in zip(tensor.dims, dims[1:]))


def fold_batch_norms(module, spec: ModelSpec):
    """The module with every eval-mode BatchNorm folded into the convolution before it (torch.fx).

    Inference-only: one kernel and one pass over memory fewer per conv. Returns (module, folded);
    the module is returned unchanged where torch.fx cannot trace it or the folded one does not
    match it within the spec's fp32 tolerance.
    """
    import torch
    from torch.fx.experimental.optimization import fuse

    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        return module, False
    try:
        folded = fuse(module)
    except Exception:  # symbolic tracing fails on data-dependent control flow: keep the module
        return module, False
    example = sample_inputs(spec, batch=2, seed=7)
    args = [torch.from_numpy(example[t.name]) for t in spec.inputs]
    with torch.no_grad():
        want, got = module(*args), folded(*args)
    pairs = zip(*(o if isinstance(o, (tuple, list)) else (o,) for o in (want, got)))
    atol, rtol = spec.tolerances["fp32"]
    same = all(torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol) for a, b in pairs)
    return (folded, True) if same else (module, False)
