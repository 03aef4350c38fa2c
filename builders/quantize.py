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

from builders.errors import SpecError, ValidationError
from builders.spec import ModelSpec

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
            raise SpecError(f"model {spec.name!r} has no default calibration data: pass --calibration DIR|FILE.npy")
        data = default
    elif source.is_dir():
        data = _images(source, spec)
    else:
        data = _npy(source)
    _check_shape(spec, data)
    return np.ascontiguousarray(data[:MAX_CALIBRATION_SAMPLES], dtype=spec.inputs[0].numpy_dtype)


def _images(folder: Path, spec: ModelSpec) -> np.ndarray:
    from PIL import Image

    from clients.inputs import preprocess_image

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


def _check_shape(spec: ModelSpec, data: np.ndarray) -> None:
    dims = spec.inputs[0].dims
    fits = data.ndim == len(dims) + 1 and all(d in (-1, got) for d, got in zip(dims, data.shape[1:]))
    if not fits or len(data) == 0:
        raise SpecError(
            f"calibration data of shape {list(data.shape)} does not fit input {spec.inputs[0].name!r} "
            f"(batch, {', '.join(map(str, dims))}) of model {spec.name!r}"
        )


def quantize(fp32_path: Path, out_path: Path, spec: ModelSpec, data: np.ndarray, for_tensorrt: bool) -> QuantizeResult:
    """Write a QDQ INT8 model of fp32_path to out_path (atomically).

    Args:
        for_tensorrt: symmetric int8 activations (TensorRT); else uint8 ones (ONNX Runtime CPU).
    """
    partial = out_path.with_suffix(".partial.onnx")
    activations = "int8 symmetric (TensorRT)" if for_tensorrt else "uint8 asymmetric (ONNX Runtime CPU)"
    try:
        quantizer = for_tensorrt and _quantize_modelopt(fp32_path, partial, data)
        quantizer = quantizer or _quantize_ort(fp32_path, partial, spec, data, symmetric=for_tensorrt)
        os.replace(partial, out_path)
    finally:
        partial.unlink(missing_ok=True)
    return QuantizeResult(out_path, quantizer, len(data), activations)


def _quantize_modelopt(fp32_path: Path, out_path: Path, data: np.ndarray) -> str | None:
    try:
        from modelopt.onnx.quantization import quantize as modelopt_quantize
    except ImportError:
        return None
    modelopt_quantize(str(fp32_path), quantize_mode="int8", calibration_data=data, output_path=str(out_path))
    return "nvidia-modelopt"


class _Reader:
    """onnxruntime.quantization CalibrationDataReader over fixed-size batches."""

    def __init__(self, name: str, data: np.ndarray):
        self.batches = iter([{name: data[i : i + CALIBRATION_BATCH]} for i in range(0, len(data), CALIBRATION_BATCH)])

    def get_next(self):
        return next(self.batches, None)


def _quantize_ort(fp32_path: Path, out_path: Path, spec: ModelSpec, data: np.ndarray, symmetric: bool) -> str:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = out_path.with_suffix(".pre.onnx")
    try:
        quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(out_path),
            _Reader(spec.inputs[0].name, data),
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


def onnx_accuracy(path: Path, x: np.ndarray, y: np.ndarray, input_name: str) -> float:
    """Top-1 accuracy of an ONNX model in ONNX Runtime (CPU) on (x, y)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {input_name: x})
    return float((logits.argmax(axis=1) == y).mean())


def accuracy_gate(spec: ModelSpec, fp32: float, int8: float, report_path: Path, details: dict) -> dict:
    """Record FP32 vs INT8 accuracy; raise if INT8 trails by more than the budget."""
    report = {"model": spec.name, "precision": "int8", "fp32_accuracy": fp32, "int8_accuracy": int8,
              "budget": ACCURACY_BUDGET, "passed": fp32 - int8 <= ACCURACY_BUDGET, **details}  # fmt: skip
    report_path.write_text(json.dumps(report, indent=2))
    if not report["passed"]:
        raise ValidationError(
            f"model {spec.name!r}: INT8 held-out accuracy {int8:.4f} trails FP32 {fp32:.4f} by more than "
            f"{ACCURACY_BUDGET:.0%} (report {report_path}); calibrate on more representative data "
            "(--calibration DIR|FILE.npy) or keep the FP32 variant"
        )
    return report
