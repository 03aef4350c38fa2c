"""The build pipeline of one model: torch module → ONNX → validation gate → repository."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from builders import export, repository, validate, zoo
from builders.cli_support import step
from builders.environment import host_info, tool_versions
from builders.spec import ModelSpec


@dataclass(frozen=True)
class BuildRequest:
    """What to build, where, and how to serve it."""

    spec: ModelSpec
    target: str
    repo: Path
    work_dir: Path
    options: repository.ServingOptions = repository.ServingOptions()
    force: bool = False


def build_hash(spec: ModelSpec) -> str:
    """Hash of everything the ONNX artifact depends on: spec, builder source, torch, exporter."""
    import torch

    parts = [spec.fingerprint(), zoo.builder_source_hash(spec), torch.__version__]
    parts.append(hashlib.sha256(Path(export.__file__).read_bytes()).hexdigest())
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _validated_artifact(req: BuildRequest, built: zoo.BuiltModel | None) -> tuple[export.ExportResult, dict]:
    """Reuse the earlier export if its inputs are unchanged and it passed; else build it anew."""
    out_dir, digest = req.work_dir / req.spec.name, build_hash(req.spec)
    earlier = None if req.force or built is not None else export.up_to_date(out_dir, digest)
    report = _passed_report(out_dir) if earlier else None
    if earlier and report:
        step(f"{req.spec.name}: inputs unchanged, reusing {earlier.path} (use --force to rebuild)")
        return earlier, report
    if built is None:
        step(f"{req.spec.name}: building the torch module ({req.spec.builder}, weights={req.spec.weights})")
        built = zoo.build_module(req.spec)
    if built.metrics:
        step(f"{req.spec.name}: builder metrics {built.metrics}")
    step(f"{req.spec.name}: exporting to ONNX (opset {req.spec.opset}, dynamic batch 1..{req.spec.max_batch_size})")
    result = export.export_onnx(built.module, req.spec, out_dir, digest, built.metrics)
    step(f"{req.spec.name}: validating PyTorch vs ONNX Runtime on batches {list(req.spec.validation_batch_sizes)}")
    report = validate.validate(built.module, result.path, req.spec, sample_data=built.sample_data)
    return result, report


def _passed_report(out_dir: Path) -> dict | None:
    try:
        report = json.loads((out_dir / validate.REPORT).read_text())
    except (OSError, ValueError):
        return None
    return report if report.get("passed") else None


def build_model(req: BuildRequest, built: zoo.BuiltModel | None = None) -> dict:
    """Build one model into the repository; return its manifest entry.

    Args:
        req: what to build and where.
        built: an already-built torch module to export (the cache is then bypassed).
    """
    started = time.time()
    artifact, report = _validated_artifact(req, built)
    config = repository.model_config(req.spec, req.target, req.options)
    step(f"{req.spec.name}: writing {req.repo / req.spec.name} (target {req.target})")
    repository.write_model(req.repo, req.spec, config, artifact.path, req.target)
    entry = _manifest_entry(req, config, artifact, report, started)
    repository.update_manifest(req.repo, entry)
    return entry


def _manifest_entry(req, config, artifact, report, started) -> dict:
    worst = max((s["max_abs"] for b in report["batches"] for s in b["outputs"].values()), default=0.0)
    return {
        "name": req.spec.name,
        "target": req.target,
        "backend": config.backend or config.platform,
        "precision": "fp32",
        "artifact": f"{req.spec.name}/1/model.onnx",
        "sha256": artifact.sha256,
        "accuracy": artifact.metrics.get("accuracy"),
        "metrics": artifact.metrics,
        "validation": {
            "passed": report["passed"],
            "max_abs_error": worst,
            "atol": report["atol"],
            "rtol": report["rtol"],
        },
        "spec": req.spec.to_dict(),
        "versions": tool_versions(),
        "host": host_info(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.time() - started, 1),
    }
