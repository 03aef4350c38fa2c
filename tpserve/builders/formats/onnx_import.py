"""ONNX files users bring: checked, run in ONNX Runtime with the spec's shapes, stamped like an export.

There is no PyTorch module to compare with, so the gate is: the ONNX checker and strict
shape inference pass, the graph's inputs and outputs are the spec's (names, dtypes, a dynamic
batch axis, the dims), and ONNX Runtime runs every validation shape case giving outputs of the
spec's shapes, dtypes and finite values. validation.json is written either way.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tpserve.builders.formats import export
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import ExportError, ValidationError

ONNX_DTYPES = {1: "float32", 10: "float16", 7: "int64", 6: "int32", 2: "uint8", 9: "bool"}


def import_onnx(spec: ModelSpec, out_dir: Path, build_hash: str) -> export.ExportResult:
    """Copy the spec's ONNX file to out_dir/model.onnx, checked and shape-inferred; stamp it.

    Raises:
        ExportError: the file is not a valid ONNX model or its tensors differ from the spec.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    final, partial = out_dir / "model.onnx", out_dir / "model.onnx.partial"
    shutil.copyfile(spec.builder_args["onnx"], partial)
    try:
        export.check_and_infer(partial, spec)
        _check_dtypes(partial, spec)
    except ExportError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, final)
    sha = export.file_sha256(final)
    (out_dir / export.STAMP).write_text(json.dumps({"build_hash": build_hash, "sha256": sha, "metrics": {}}))
    return export.ExportResult(final, sha, reused=False, metrics={})


def _check_dtypes(path: Path, spec: ModelSpec) -> None:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)}
    for tensor in spec.inputs + spec.outputs:
        got = ONNX_DTYPES.get(types[tensor.name], f"ONNX type {types[tensor.name]}")
        if got != tensor.numpy_dtype:
            raise ExportError(
                f"model {spec.name!r}: tensor {tensor.name!r} is {got} in the ONNX file, the spec says "
                f"{tensor.dtype} ({tensor.numpy_dtype}); fix the spec's dtype"
            )


def validate_runs(spec: ModelSpec, path: Path) -> dict:
    """Run ONNX Runtime on every validation shape case; outputs must fit the spec and be finite.

    Returns:
        The report (also written to validation.json beside the model).

    Raises:
        ValidationError: a run failed or gave outputs of the wrong shape, dtype or non-finite values.
    """
    import onnxruntime as ort

    from tpserve.builders.checks.validate import REPORT, shape_cases

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    cases, failures = [], []
    for batch, lengths in shape_cases(spec):
        outputs, problem = _run_case(session, spec, batch, lengths)
        cases.append({"batch": batch, "axes": lengths, "outputs": outputs, "problem": problem})
        failures += [problem] if problem else []
    report = {
        "model": spec.name,
        "reference": "the spec's shapes and dtypes",
        "candidate": "onnxruntime",
        "precision": "fp32",
        "atol": None,
        "rtol": None,
        "passed": not failures,
        "batches": cases,
    }
    (path.parent / REPORT).write_text(json.dumps(report, indent=2))
    if failures:
        raise ValidationError(
            f"model {spec.name!r}: the ONNX model failed on the spec's shapes: {failures[0]} "
            f"({len(failures)} case(s) failed, details in {path.parent / REPORT})"
        )
    return report


def _run_case(session, spec: ModelSpec, batch: int, lengths: dict) -> tuple[dict, str | None]:
    import numpy as np

    feeds = export.sample_inputs(spec, batch, seed=batch, lengths=lengths)
    try:
        results = session.run([t.name for t in spec.outputs], feeds)
    except Exception as err:  # onnxruntime raises its own exception types
        return {}, f"batch {batch}, axes {lengths}: onnxruntime failed: {err}"
    outputs = {}
    for tensor, value in zip(spec.outputs, results):
        finite = bool(np.isfinite(value).all()) if value.dtype.kind == "f" else True
        outputs[tensor.name] = {"shape": list(value.shape), "dtype": str(value.dtype), "max_abs": 0.0, "finite": finite}
        if not export.tensor_spec_matches(tensor, [-1, *value.shape[1:]]) or value.shape[0] != batch:
            return outputs, f"batch {batch}: output {tensor.name!r} has shape {list(value.shape)}, spec {tensor.dims}"
        if not outputs[tensor.name]["finite"]:
            return outputs, f"batch {batch}, axes {lengths}: output {tensor.name!r} has NaN or Inf values"
    return outputs, None
