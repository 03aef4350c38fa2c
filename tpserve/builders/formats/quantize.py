"""INT8 by explicit quantization: a QDQ ONNX model from calibration data.

TensorRT 10 deprecates implicit INT8 calibration: the QDQ model made here is what the
TensorRT build consumes (INT8 enabled), and ONNX Runtime runs it on the CPU as it is.
For TensorRT (the ngc target), NVIDIA ModelOpt's ONNX quantizer is used where it is
installed, else ONNX Runtime's static quantizer configured as TensorRT expects: symmetric
int8 activations and per-channel symmetric weights. For ONNX Runtime on the CPU (the
embedded target), activations are asymmetric uint8 (U8S8): x86's fast path, measured 2.0x
FP32 on ResNet-18 where S8S8 gave no gain (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import SpecError, ValidationError

CALIBRATION_BATCH = 32
MAX_CALIBRATION_SAMPLES = 512
ACCURACY_BUDGET = 0.01  # INT8 held-out accuracy may trail FP32 by at most 1 point


@dataclass(frozen=True)
class QuantizeResult:
    """The QDQ model, which quantizer made it, and from how many calibration samples."""

    path: Path
    quantizer: str
    samples: int
    activations: str


def calibration_data(spec: ModelSpec, source: Path | None, default: np.ndarray | None) -> np.ndarray:
    """Calibration inputs for the spec's first input: a folder of images, an .npy, or the default.

    Raises:
        SpecError: no source given and the spec has no default, or the source does not fit.
    """
    if source is None:
        if default is None:
            raise SpecError(
                f"model {spec.name!r} has no default calibration data for INT8: give the spec's model "
                'calibration = "calib.npz" (one array per input), or --calibration DIR|FILE.npy (make: CALIBRATION=...)'
            )
        data = default
    elif source.is_dir():
        data = _images(source, spec)
    else:
        data = _npy(source)
    return _fit(spec, spec.inputs[0], data)


def calibration_feeds(spec: ModelSpec, source: Path | None, default) -> dict[str, np.ndarray]:
    """Calibration inputs for every input of the spec, by name.

    Args:
        source: an .npz with one array per input (any model), or what calibration_data takes
            (single-input models): a folder of images or an .npy.
        default: the spec's own data (an array for the first input, or a dict by input name).
    """
    if source is not None and source.suffix == ".npz":
        return _npz(source, spec)
    if isinstance(default, dict) and source is None:
        return {t.name: _fit(spec, t, default[t.name]) for t in spec.inputs}
    if len(spec.inputs) > 1:
        raise SpecError(
            f"model {spec.name!r} has {len(spec.inputs)} inputs: INT8 calibrates on an .npz with one array per "
            f"input ({', '.join(t.name for t in spec.inputs)}; numpy.savez(path, **arrays)): give the spec's model "
            'calibration = "calib.npz", or --calibration calib.npz (make: CALIBRATION=calib.npz); or leave int8 out'
        )
    return {spec.inputs[0].name: calibration_data(spec, source, default)}


def _npz(path: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except (OSError, ValueError) as err:
        raise SpecError(f"calibration file {path} is not a readable .npz archive: {err}") from err
    missing = [t.name for t in spec.inputs if t.name not in arrays]
    if missing:
        raise SpecError(f"calibration file {path} lacks arrays for inputs {missing} of model {spec.name!r}")
    feeds = {t.name: _fit(spec, t, arrays[t.name]) for t in spec.inputs}
    if len({len(a) for a in feeds.values()}) != 1:
        raise SpecError(f"calibration file {path}: the arrays must hold the same number of samples")
    return feeds


def _fit(spec: ModelSpec, tensor, data: np.ndarray) -> np.ndarray:
    dims = tensor.dims
    fits = data.ndim == len(dims) + 1 and all(d in (-1, got) for d, got in zip(dims, data.shape[1:]))
    if not fits or len(data) == 0:
        raise SpecError(
            f"calibration data of shape {list(data.shape)} does not fit input {tensor.name!r} "
            f"(batch, {', '.join(map(str, dims))}) of model {spec.name!r}"
        )
    return np.ascontiguousarray(data[:MAX_CALIBRATION_SAMPLES], dtype=tensor.numpy_dtype)


def _images(folder: Path, spec: ModelSpec) -> np.ndarray:
    from PIL import Image

    from tpserve.builders.spec.images import preprocess_image

    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp"))
    if not files:
        raise SpecError(f"calibration folder {folder} holds no .png/.jpg/.jpeg/.bmp images")
    samples = []
    for path in files[:MAX_CALIBRATION_SAMPLES]:
        with Image.open(path) as image:
            samples.append(preprocess_image(image, spec))
    return np.stack(samples)


def _npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise SpecError(f"calibration file {path} is not a readable .npy array: {err}") from err


def quantize(fp32_path: Path, out_path: Path, spec: ModelSpec, data, for_tensorrt: bool) -> QuantizeResult:
    """Write a QDQ INT8 model of fp32_path to out_path (atomically).

    Args:
        data: calibration inputs: a dict by input name, or one array for the first input.
        for_tensorrt: symmetric int8 activations (TensorRT); else uint8 ones (ONNX Runtime CPU).
    """
    data = data if isinstance(data, dict) else {spec.inputs[0].name: data}
    partial = out_path.with_suffix(".partial.onnx")
    activations = "int8 symmetric (TensorRT)" if for_tensorrt else "uint8 asymmetric (ONNX Runtime CPU)"
    try:
        quantizer = for_tensorrt and _quantize_modelopt(fp32_path, partial, data)
        quantizer = quantizer or _quantize_ort(fp32_path, partial, spec, data, symmetric=for_tensorrt)
        os.replace(partial, out_path)
    finally:
        partial.unlink(missing_ok=True)
    return QuantizeResult(out_path, quantizer, len(next(iter(data.values()))), activations)


def _quantize_modelopt(fp32_path: Path, out_path: Path, data: dict) -> str | None:
    try:
        from modelopt.onnx.quantization import quantize as modelopt_quantize
    except ImportError:
        return None
    modelopt_quantize(str(fp32_path), quantize_mode="int8", calibration_data=data, output_path=str(out_path))
    return "nvidia-modelopt"


class _Reader:
    """onnxruntime.quantization CalibrationDataReader over fixed-size batches."""

    def __init__(self, feeds: dict):
        count = len(next(iter(feeds.values())))
        self.batches = iter(
            [{k: v[i : i + CALIBRATION_BATCH] for k, v in feeds.items()} for i in range(0, count, CALIBRATION_BATCH)]
        )

    def get_next(self):
        return next(self.batches, None)


def _quantize_ort(fp32_path: Path, out_path: Path, spec: ModelSpec, data: dict, symmetric: bool) -> str:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = out_path.with_suffix(".pre.onnx")
    try:
        quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(out_path),
            _Reader(data),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True},
        )
    finally:
        prepared.unlink(missing_ok=True)
    return "onnxruntime.quantization"


def onnx_accuracy(path: Path, x, y: np.ndarray, input_name: str | None = None) -> float:
    """Top-1 accuracy (first output) of an ONNX model in ONNX Runtime (CPU) on (x, y).

    Args:
        x: a dict of inputs by name, or one array for input_name.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits = session.run(None, x if isinstance(x, dict) else {input_name: x})[0]
    return float((logits.argmax(axis=1) == y).mean())


def accuracy_gate(spec: ModelSpec, fp32: float, int8: float, report_path: Path, details: dict) -> dict:
    """Record FP32 vs INT8 accuracy; raise if INT8 trails by more than the budget."""
    report = {
        "model": spec.name,
        "precision": "int8",
        "fp32_accuracy": fp32,
        "int8_accuracy": int8,
        "budget": ACCURACY_BUDGET,
        "passed": fp32 - int8 <= ACCURACY_BUDGET,
        **details,
    }
    report_path.write_text(json.dumps(report, indent=2))
    if not report["passed"]:
        raise ValidationError(
            f"model {spec.name!r}: INT8 held-out accuracy {int8:.4f} trails FP32 {fp32:.4f} by more than "
            f"{ACCURACY_BUDGET:.0%} (report {report_path}); calibrate on more representative data "
            "(--calibration DIR|FILE.npy) or keep the FP32 variant"
        )
    return report
