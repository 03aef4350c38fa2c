"""TensorRT 10 plans from validated ONNX models, through Polygraphy's API.

Runs where `tensorrt` imports: inside the NGC TensorRT container of the same release as
the Triton server (`make build-engines-docker`). TensorRT 10 API only: memory-pool limits
(no max_workspace_size), build_serialized_network under Polygraphy (no build_engine), and
INT8 from QDQ models (no implicit calibrators).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from tpserve.builders.formats.tensorrt_profile import EngineOptions, length_profiles, profile_shapes
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import ToolError, ValidationError


class TensorRTUnavailable(ToolError):
    """TensorRT is not importable here."""


def require_tensorrt():
    """The tensorrt module, or a TensorRTUnavailable error that says where it is."""
    try:
        import tensorrt
    except ImportError as err:
        raise TensorRTUnavailable(
            f"TensorRT is not importable here ({err}): build plans inside the NGC TensorRT container "
            "with `make build-engines-docker` (same NGC release as the server image)"
        ) from err
    return tensorrt


def engine_metadata(options: EngineOptions) -> dict:
    """What the plan depends on: TensorRT and CUDA versions, GPU name and compute capability."""
    trt = require_tensorrt()
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return {
        "tensorrt": trt.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": f"{major}.{minor}",
        "hardware_compatible": options.hardware_compatible,
        "version_compatible": options.version_compatible,
        "precision": options.precision,
    }


def _create_config(trt, spec: ModelSpec, options: EngineOptions, cache: Path):
    from polygraphy.backend.trt import CreateConfig, Profile

    profiles = []
    for shapes in length_profiles(spec, options):  # one per length bucket for sequence models
        profile = Profile()
        for name, (low, opt, high) in shapes.items():
            profile.add(name, min=low, opt=opt, max=high)
        profiles.append(profile)
    hardware = trt.HardwareCompatibilityLevel.AMPERE_PLUS if options.hardware_compatible else None
    return CreateConfig(
        fp16=options.precision in ("fp16", "int8"),
        int8=options.precision == "int8",
        profiles=profiles,
        load_timing_cache=str(cache) if cache.exists() else None,
        builder_optimization_level=options.optimization_level,
        memory_pool_limits={trt.MemoryPoolType.WORKSPACE: options.workspace_mib << 20},
        hardware_compatibility_level=hardware,
        version_compatible=options.version_compatible,
    )


def build_engine(onnx_path: Path, plan_path: Path, spec: ModelSpec, options: EngineOptions, cache: Path) -> dict:
    """Build and save one plan (the timing cache is loaded and saved back); return its metadata."""
    trt = require_tensorrt()
    from polygraphy.backend.trt import engine_from_network, network_from_onnx_path, save_engine

    config = _create_config(trt, spec, options, cache)
    engine = engine_from_network(network_from_onnx_path(str(onnx_path)), config=config, save_timing_cache=str(cache))
    partial = plan_path.with_suffix(".partial")
    save_engine(engine, str(partial))
    partial.replace(plan_path)
    return engine_metadata(options)


def compare_engine(plan: Path, onnx_path: Path, spec: ModelSpec, options: EngineOptions, report: Path) -> dict:
    """TensorRT vs ONNX Runtime (CPU) on the profile's min/opt/max batches, per-precision tolerances."""
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    from polygraphy.comparator import Comparator, DataLoader
    from polygraphy.comparator.compare import SimpleCompareFunc

    atol, rtol = spec.tolerances[options.precision]
    shapes = profile_shapes(spec, options)
    results = []
    for i in range(3):
        meta = {name: (None, triple[i]) for name, triple in shapes.items()}
        runners = [TrtRunner(EngineFromBytes(BytesFromPath(str(plan)))), OnnxrtRunner(SessionFromOnnx(str(onnx_path)))]
        run = Comparator.run(runners, data_loader=DataLoader(input_metadata=_metadata(meta), iterations=1))
        passed = bool(Comparator.compare_accuracy(run, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol)))
        results.append({"shapes": {k: list(v[1]) for k, v in meta.items()}, "passed": passed})
    summary = {
        "model": spec.name,
        "precision": options.precision,
        "atol": atol,
        "rtol": rtol,
        "reference": "onnxruntime",
        "candidate": "tensorrt",
        "runs": results,
        "passed": all(r["passed"] for r in results),
    }
    report.write_text(json.dumps(summary, indent=2))
    if not summary["passed"]:
        raise ValidationError(
            f"{spec.name}: TensorRT {options.precision} differs from ONNX Runtime beyond "
            f"atol {atol:g} / rtol {rtol:g}; see {report}"
        )
    return summary


def _metadata(shapes: dict):
    from polygraphy.common import TensorMetadata

    meta = TensorMetadata()
    for name, (dtype, shape) in shapes.items():
        meta.add(name, dtype, shape)
    return meta


TRTEXEC_FIELDS = {
    "throughput_qps": r"Throughput: ([\d.]+) qps",
    "gpu_compute_mean_ms": r"GPU Compute Time: min = [\d.]+ ms, max = [\d.]+ ms, mean = ([\d.]+) ms",
    "h2d_mean_ms": r"H2D Latency: min = [\d.]+ ms, max = [\d.]+ ms, mean = ([\d.]+) ms",
    "d2h_mean_ms": r"D2H Latency: min = [\d.]+ ms, max = [\d.]+ ms, mean = ([\d.]+) ms",
    "latency_mean_ms": r"Latency: min = [\d.]+ ms, max = [\d.]+ ms, mean = ([\d.]+) ms",
}


def parse_trtexec(text: str) -> dict:
    """trtexec's performance summary → numbers (missing ones are left out)."""
    found = {}
    for key, pattern in TRTEXEC_FIELDS.items():
        match = re.search(pattern, text)
        if match:
            found[key] = float(match.group(1))
    return found


def time_engine(plan: Path, shapes: dict[str, tuple]) -> dict:
    """Time a plan with trtexec (GPU compute, H2D/D2H, throughput) at the given input shapes."""
    trtexec = shutil.which("trtexec") or "/usr/src/tensorrt/bin/trtexec"
    spec = ",".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in shapes.items())
    done = subprocess.run(
        [trtexec, f"--loadEngine={plan}", f"--shapes={spec}", "--useCudaGraph"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise ToolError(f"trtexec failed on {plan}: {done.stderr.strip()[-400:]}")
    return parse_trtexec(done.stdout)
