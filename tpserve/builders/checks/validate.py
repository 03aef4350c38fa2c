"""The validation gate: PyTorch (reference) vs ONNX Runtime through Polygraphy's Python API."""

from __future__ import annotations

import json
from pathlib import Path

from tpserve.builders.checks import agreement
from tpserve.builders.formats.export import sample_inputs
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import ValidationError

REPORT = "validation.json"


def _quiet_polygraphy():
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.WARNING


def shape_cases(spec: ModelSpec) -> list[tuple[int, dict]]:
    """(batch, {axis: length}) pairs to compare on: every validation batch size, and for each
    the min, a middle and the max length of every named dynamic axis."""
    axes = sorted({a for t in spec.inputs for a in t.axes})
    options = {a: spec.axis_lengths(a) for a in axes}
    count = max((len(v) for v in options.values()), default=1)
    return [
        (b, {a: options[a][k % len(options[a])] for a in axes})
        for b in spec.validation_batch_sizes
        for k in range(count)
    ]


def _feeds(spec: ModelSpec, batch: int, sample_data: dict | None, lengths: dict | None = None) -> dict:
    """Real inputs where the builder gave some, else random."""
    feeds = sample_inputs(spec, batch, seed=batch, lengths=lengths)
    if sample_data is None:
        return feeds
    if "inputs" in sample_data:  # real inputs for every tensor (e.g. tokenized text)
        return {name: array[:batch] for name, array in sample_data["inputs"].items()}
    if len(sample_data["x"]) >= batch:
        feeds[spec.inputs[0].name] = sample_data["x"][:batch]
    return feeds


def _compare_batch(module, onnx_path: Path, spec: ModelSpec, feeds: dict, tol) -> dict:
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from tpserve.builders.checks.torch_runner import TorchFunctionRunner

    metadata = _metadata(feeds)
    runners = [
        TorchFunctionRunner(module, metadata, [t.name for t in spec.outputs]),
        OnnxrtRunner(SessionFromOnnx(str(onnx_path), providers=["cpu"]), name="onnxruntime"),
    ]
    return _compare_runners(runners, feeds, tol)


def _metadata(feeds: dict):
    from polygraphy.common import TensorMetadata

    metadata = TensorMetadata()
    for name, array in feeds.items():
        metadata.add(name, array.dtype, array.shape)
    return metadata


def _compare_runners(runners, feeds: dict, tol, outputs: list | None = None) -> dict:
    """Each output's element-wise figures, the first runner against the second; outputs (where given) gains each
    runner's arrays, name -> array, in the runners' order."""
    from polygraphy.comparator import Comparator
    from polygraphy.comparator.compare import SimpleCompareFunc

    results = Comparator.run(runners, data_loader=[feeds])
    compare = SimpleCompareFunc(atol=tol[0], rtol=tol[1])
    accuracy = Comparator.compare_accuracy(results, compare_func=compare)
    (iteration,) = next(iter(accuracy[0].values()))
    if outputs is not None:
        outputs.extend({name: _array(found[name]) for name in found.keys()} for _, (found,) in results)
    return {name: _stats(result) for name, result in iteration.items()}


def _array(value):
    import numpy as np

    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else np.asarray(value)


def _stats(result) -> dict:
    return {
        "max_abs": float(result.max_absdiff),
        "max_rel": float(result.max_reldiff),
        "mean_abs": float(result.mean_absdiff),
        "passed": bool(result),
    }


def validate(
    module, onnx_path: Path, spec: ModelSpec, precision: str = "fp32", sample_data: dict | None = None
) -> dict:
    """Compare PyTorch and ONNX Runtime on every validation batch size of the spec.

    validation.json is written beside the ONNX model whether the comparison passes or not.

    Returns:
        The report (also written to validation.json).

    Raises:
        ValidationError: an output differs by more than the precision's tolerance.
    """
    import polygraphy

    _quiet_polygraphy()
    tol = spec.tolerances[precision]
    cases = shape_cases(spec) if not (sample_data and "inputs" in sample_data) else _batches_only(spec)
    batches: list[dict] = [
        {
            "batch": b,
            "axes": lengths,
            "outputs": _compare_batch(module, onnx_path, spec, _feeds(spec, b, sample_data, lengths), tol),
        }
        for b, lengths in cases
    ]
    failures = [(b["batch"], name, s) for b in batches for name, s in b["outputs"].items() if not s["passed"]]
    report = {
        "model": spec.name,
        "reference": "pytorch",
        "candidate": "onnxruntime",
        "precision": precision,
        "atol": tol[0],
        "rtol": tol[1],
        "passed": not failures,
        "batches": batches,
        "polygraphy": polygraphy.__version__,
    }
    (onnx_path.parent / REPORT).write_text(json.dumps(report, indent=2))
    if failures:
        raise ValidationError(_failure_message(spec, failures, tol, onnx_path.parent / REPORT))
    return report


def validate_torch(reference, candidate, spec: ModelSpec, precision: str, report_path: Path, what: str) -> dict:
    """Compare two torch callables (numpy in, tensors out) on the spec's shape cases, as the ONNX gate does.

    Used for compiled engines: the candidate at `precision` against the fp32 eager module. The
    report is written to report_path either way.

    Raises:
        ValidationError: an output differs by more than the precision's tolerance.
    """
    from tpserve.builders.checks.torch_runner import TorchFunctionRunner

    _quiet_polygraphy()
    tol, names = spec.tolerances[precision], [t.name for t in spec.outputs]
    mask = next((t.name for t in spec.inputs if t.is_mask), None)  # per-token outputs: real tokens compared only
    masked = dict(mask=mask, per_token=[-1 in t.dims for t in spec.outputs])
    batches: list[dict] = []
    figures: list = []  # every case's per-output agreement figures (builders/checks/agreement.py)
    for batch, lengths in shape_cases(spec):
        feeds = _feeds(spec, batch, None, lengths)
        runners = [
            TorchFunctionRunner(reference, _metadata(feeds), names, name="pytorch fp32 eager", **masked),
            TorchFunctionRunner(candidate, _metadata(feeds), names, name=what, **masked),
        ]
        arrays: list = []
        batches.append({"batch": batch, "axes": lengths, "outputs": _compare_runners(runners, feeds, tol, arrays)})
        figures.extend(agreement.compare(spec, precision, arrays[0], arrays[1]))
    failures = [(b["batch"], name, s) for b in batches for name, s in b["outputs"].items() if not s["passed"]]
    worst = agreement.worst_per_output(figures)
    report = {
        "model": spec.name,
        "reference": "pytorch fp32 eager",
        "candidate": what,
        "precision": precision,
        "atol": tol[0],
        "rtol": tol[1],
        "agreement": spec.agreement.get(precision, {}),
        "outputs": [f.to_dict() for f in worst],
        "passed": not failures and all(f.passed for f in worst),
        "batches": batches,
    }
    report_path.write_text(json.dumps(report, indent=2))
    if not failures and not report["passed"]:
        raise ValidationError(agreement.missed_message(spec, precision, worst, "the validation cases", report_path))
    if failures:
        batch, name, stats = max(failures, key=lambda f: f[2]["max_abs"])
        raise ValidationError(
            f"{what} of {spec.name!r} failed validation against the fp32 eager module: output {name!r} at batch "
            f"{batch}: max abs error {stats['max_abs']:.3g} (atol {tol[0]:g}), max rel error {stats['max_rel']:.3g} "
            f"(rtol {tol[1]:g}); details in {report_path}. Nothing was written to the repository; loosen the "
            f"spec's {precision} tolerances if the difference is expected, or serve another precision"
        )
    return report


def _batches_only(spec: ModelSpec) -> list[tuple[int, dict]]:
    return [(b, {}) for b in spec.validation_batch_sizes]


def _failure_message(spec: ModelSpec, failures: list, tol, report_path: Path) -> str:
    batch, name, stats = max(failures, key=lambda f: f[2]["max_abs"])
    return (
        f"model {spec.name!r} failed validation (PyTorch vs ONNX Runtime): output {name!r} at batch "
        f"{batch}: max abs error {stats['max_abs']:.3g} (atol {tol[0]:g}), max rel error "
        f"{stats['max_rel']:.3g} (rtol {tol[1]:g}); {len(failures)} comparison(s) failed, details in "
        f"{report_path}. The export changed the model's numerics: check for ops that differ between "
        "training and eval mode, or loosen the spec's tolerances if the difference is expected"
    )
