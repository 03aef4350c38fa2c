"""TensorRT plan variants of built models: <model>_trt_<precision> in the repository.

Needs TensorRT (the NGC container, `make build-engines-docker`). Per model and precision:
build the plan from the validated ONNX (INT8: from a symmetric QDQ model), compare it with
ONNX Runtime, derive a config that stays inside the profile, add the plan for this GPU's
compute capability to cc_model_filenames, record versions and GPU in manifest.json.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from tpserve.builders.formats import quantize
from tpserve.builders.formats.tensorrt_build import (
    build_engine,
    compare_engine,
    engine_metadata,
    require_tensorrt,
    time_engine,
)
from tpserve.builders.formats.tensorrt_profile import (
    EngineOptions,
    batch_range,
    cc_model_filenames,
    check_config_against_profile,
    plan_filename,
    profile_shapes,
)
from tpserve.builders.repository import manifest
from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.model_config import ModelConfig, parse_pbtxt
from tpserve.builders.spec import zoo
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.cli import step
from tpserve.common.errors import SpecError


def variant_name(spec: ModelSpec, options: EngineOptions) -> str:
    """<model>_trt_<precision>, with _static<N> for static-shape engines (so both can be compared)."""
    suffix = f"_static{options.static_batch}" if options.static_batch else ""
    return f"{spec.name}_trt_{options.precision}{suffix}"


def plan_config(spec: ModelSpec, name: str, options: EngineOptions, serving: repository.ServingOptions, cc_files):
    """The config of a plan variant: tensorrt_plan on the GPU, max batch and batching inside the profile."""
    base = repository.model_config(dataclasses.replace(spec, name=name), "ngc", serving)
    gpu = dict(
        platform="tensorrt_plan",
        default_model_filename=None,
        cc_model_filenames=cc_files,
        warmup=[],
        instance_groups=[dataclasses.replace(g, kind="KIND_GPU") for g in base.instance_groups],
    )
    if options.static_batch:  # a static engine takes exactly its batch: the batch axis becomes a fixed dim
        fixed = lambda ts: [dataclasses.replace(t, dims=(options.static_batch, *t.dims), format=None) for t in ts]  # noqa: E731
        return dataclasses.replace(
            base, max_batch_size=0, dynamic_batching=None, inputs=fixed(base.inputs), outputs=fixed(base.outputs), **gpu
        )
    config = dataclasses.replace(base, **gpu)
    check_config_against_profile(config, batch_range(spec, options))
    return config


def _existing_plans(folder: Path) -> tuple[dict, dict]:
    """cc_model_filenames and plan files of an earlier build of this variant (other GPUs)."""
    config_path = folder / "config.pbtxt"
    if not config_path.exists():
        return {}, {}
    files = dict(parse_pbtxt(config_path.read_text()).cc_model_filenames)
    return files, {name: folder / "1" / name for name in files.values() if (folder / "1" / name).exists()}


def _source_onnx(spec: ModelSpec, work_dir: Path, precision: str, calibration: Path | None) -> Path:
    fp32 = work_dir / spec.name / "model.onnx"
    if not fp32.exists():
        raise SpecError(f"{spec.name}: no validated ONNX in {fp32.parent}; run `make build-engines` first")
    if precision != "int8":
        return fp32
    out = work_dir / spec.name / "model.int8.trt.onnx"
    data = quantize.calibration_data(spec, calibration, zoo.reference_data(spec).get("calibration"))
    return quantize.quantize(fp32, out, spec, data, for_tensorrt=True).path


def build_plan_variant(
    spec: ModelSpec,
    repo: Path,
    work_dir: Path,
    options: EngineOptions,
    serving: repository.ServingOptions,
    calibration: Path | None = None,
) -> dict:
    """Build one plan variant into the repository; return its manifest entry."""
    require_tensorrt()
    started, name = time.time(), variant_name(spec, options)
    onnx_path = _source_onnx(spec, work_dir, options.precision, calibration)
    cc = engine_metadata(options)["compute_capability"]
    plan = work_dir / spec.name / f"{options.precision}_{plan_filename(cc)}"
    step(f"{name}: building the TensorRT plan (compute capability {cc}, profile {batch_range(spec, options)})")
    metadata = build_engine(onnx_path, plan, spec, options, work_dir / "timing.cache")
    step(f"{name}: comparing TensorRT with ONNX Runtime")
    comparison = compare_engine(plan, onnx_path, spec, options, plan.with_suffix(".validation.json"))
    timing = time_engine(plan, {k: v[1] for k, v in profile_shapes(spec, options).items()})
    files, plans = _existing_plans(repo / name)
    config = plan_config(spec, name, options, serving, cc_model_filenames(files, cc))
    repository.write_model(
        repo, dataclasses.replace(spec, name=name), config, {**plans, plan_filename(cc): plan}, "ngc"
    )
    return _plan_entry(repo, name, spec, config, {**metadata, "file": plan_filename(cc)}, comparison, timing, started)


def _plan_entry(repo, name, spec, config: ModelConfig, metadata, comparison, timing, started) -> dict:
    from tpserve.builders.environment import host_info, tool_versions

    engines = manifest.read_manifest(repo)["models"].get(name, {}).get("engines", {})
    entry = manifest.ManifestEntry(
        name=name,
        target="ngc",
        backend="tensorrt_plan",
        precision=metadata["precision"],
        engines={**engines, metadata["compute_capability"]: metadata},
        validation=comparison,
        timing=timing,
        spec=spec.to_dict(),
        versions=tool_versions(),
        host=host_info(),
        max_batch_size=config.max_batch_size,
        build_seconds=round(time.time() - started, 1),
    )
    manifest.update_manifest(repo, entry)
    return entry.to_dict()
