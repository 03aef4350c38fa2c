"""The build pipeline of one model: torch module → ONNX → validation gate → repository."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from pathlib import Path

from tpserve.builders.checks import agreement, validate
from tpserve.builders.environment import host_info, tool_versions
from tpserve.builders.formats import export, quantize
from tpserve.builders.repository import manifest
from tpserve.builders.repository import writer as repository
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import user_models, zoo
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.cli import step
from tpserve.common.errors import SpecError, ToolError, ValidationError


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
    has_torch = (out_dir / "model.pt").exists() or req.spec.builder == user_models.ONNX
    if earlier and report and has_torch:
        step(f"{req.spec.name}: inputs unchanged, reusing {earlier.path} (use --force to rebuild)")
        return earlier, report
    if req.spec.builder == user_models.ONNX:
        return _imported_artifact(req.spec, out_dir, digest)
    if built is None:
        step(f"{req.spec.name}: building the torch module ({req.spec.builder}, weights: {weights_source(req.spec)})")
        built = zoo.build_module(req.spec)
    if built.metrics:
        step(f"{req.spec.name}: builder metrics {built.metrics}")
    step(f"{req.spec.name}: exporting to ONNX (opset {req.spec.opset}, dynamic batch 1..{req.spec.max_batch_size})")
    result = export.export_onnx(built.module, req.spec, out_dir, digest, built.metrics)
    save_state_dict(built.module, out_dir)
    save_program(built.module, req.spec, out_dir)
    step(f"{req.spec.name}: validating PyTorch vs ONNX Runtime on batches {list(req.spec.validation_batch_sizes)}")
    report = validate.validate(built.module, result.path, req.spec, sample_data=built.sample_data)
    return result, report


def _imported_artifact(spec: ModelSpec, out_dir: Path, digest: str) -> tuple[export.ExportResult, dict]:
    from tpserve.builders.formats import onnx_import

    step(f"{spec.name}: importing {spec.builder_args['onnx']} (checker, shape inference, tensors vs the spec)")
    result = onnx_import.import_onnx(spec, out_dir, digest)
    step(f"{spec.name}: running it in ONNX Runtime on the spec's shapes (batches {list(spec.validation_batch_sizes)})")
    return result, onnx_import.validate_runs(spec, result.path)


def save_program(module, spec: ModelSpec, out_dir: Path) -> Path:
    """The module as a torch.export program (model.pt2): the torch runtime loads it without the model's source.

    BatchNorms are folded into their convolutions first (inference-only, checked to agree).
    """
    import torch

    module, folded = export.fold_batch_norms(module, spec)
    if folded:
        step(f"{spec.name}: batch norms folded into their convolutions for the torch runtime")
    example = export.sample_inputs(spec, batch=2)
    args = tuple(torch.from_numpy(example[t.name]) for t in spec.inputs)
    shapes = export.shapes_for(module, spec)
    path, partial = out_dir / "model.pt2", out_dir / "model.partial.pt2"
    try:
        with torch.no_grad():
            program = torch.export.export(module, args, dynamic_shapes=shapes)
        torch.export.save(program, str(partial))
        partial.replace(path)
    except Exception as err:  # torch raises many types; the ONNX path does not need this artifact
        partial.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        step(f"{spec.name}: no torch.export program for the torch runtime ({type(err).__name__}: {err})")
    return path


def save_state_dict(module, out_dir: Path) -> Path:
    """The trained weights, for the torch runtime (architecture + state_dict, no pickled code)."""
    import torch

    path = out_dir / "model.pt"
    torch.save(module.state_dict(), path)
    return path


def weights_source(spec) -> str:
    """Where the module's weights come from, as the build log says it: a checkpoint, an exported program,
    torchvision's named weights, a training run, or random initialization."""
    args = spec.builder_args or {}
    if args.get("checkpoint"):
        return f"checkpoint {args['checkpoint']}"
    if spec.builder == user_models.EXPORTED:
        return f"the exported program {args.get('exported', '')}".rstrip()
    if "epochs" in args:
        return f"trained here ({args['epochs']} epochs)"
    return spec.weights


def _passed_report(out_dir: Path) -> dict | None:
    try:
        report = json.loads((out_dir / validate.REPORT).read_text())
    except (OSError, ValueError):
        return None
    return report if report.get("passed") else None


def build_model(req: BuildRequest, built: zoo.BuiltModel | None = None) -> dict:
    """Build one model (and its INT8 variant if asked) into the repository; return the FP32 entry.

    Args:
        req: what to build and where.
        built: an already-built torch module to export (the cache is then bypassed).
    """
    with _naming_the_spec_file(req.spec):
        return _build_model(req, built)


@contextlib.contextmanager
def _naming_the_spec_file(spec: ModelSpec):
    """Errors about a user's model name its spec file and model, whichever step raised them."""
    try:
        yield
    except ToolError as err:
        origin = spec.builder_args.get("spec_file") if spec.builder in user_models.USER_BUILDERS else None
        if origin is None or origin in str(err):
            raise
        said = str(err).removeprefix(f"model {spec.name!r}: ")  # where() names the model already
        raise type(err)(f"{user_models.where(spec)}: {said}") from err


def _build_model(req: BuildRequest, built: zoo.BuiltModel | None) -> dict:
    started = time.time()
    int8_data = _int8_data(req) if "int8" in req.precisions else None  # before anything is written
    artifact, report = _validated_artifact(req, built)
    config = repository.model_config(req.spec, req.target, req.options)
    step(f"{req.spec.name}: writing {req.repo / req.spec.name} (target {req.target})")
    repository.write_model(req.repo, req.spec, config, {"model.onnx": artifact.path}, req.target)
    entry = _manifest_entry(req, config, artifact, report, started)
    manifest.update_manifest(req.repo, entry)
    if "int8" in req.precisions:
        build_int8(req, artifact, entry, int8_data)
    return entry.to_dict()


def _int8_data(req: BuildRequest) -> dict:
    """Reference data with the calibration feeds resolved (raises if INT8 has no data to use)."""
    data = reference_feeds(req.spec, req.eval_data)
    return {**data, "calibration": quantize.calibration_feeds(req.spec, req.calibration, data.get("calibration"))}


def build_int8(
    req: BuildRequest, fp32: export.ExportResult, fp32_entry: manifest.ManifestEntry, data: dict | None = None
) -> dict:
    """Quantize the FP32 ONNX model to QDQ INT8, gate its accuracy, serve it as <model>_int8."""
    spec, started = req.spec, time.time()
    data = data or _int8_data(req)
    calibration = data["calibration"]
    out = req.work_dir / spec.name / "model.int8.onnx"
    samples = len(next(iter(calibration.values())))
    step(f"{spec.name}: quantizing to INT8 (QDQ) on {samples} calibration samples")
    result = quantize.quantize(fp32.path, out, spec, calibration, for_tensorrt=req.target == "ngc")
    report = _int8_report(spec, fp32.path, result, data)
    variant = dataclasses.replace(spec, name=f"{spec.name}_int8")
    config = repository.model_config(variant, req.target, req.options)
    step(f"{spec.name}: writing {req.repo / variant.name} (INT8, target {req.target})")
    repository.write_model(req.repo, variant, config, {"model.onnx": result.path}, req.target)
    entry = dataclasses.replace(
        fp32_entry,
        name=variant.name,
        precision="int8",
        artifact=f"{variant.name}/1/model.onnx",
        sha256=export.file_sha256(result.path),
        accuracy=report.get("int8_accuracy"),
        int8=report,
        build_seconds=round(time.time() - started, 1),
        validation={"passed": report["passed"], "kind": report["gate"]},
    )
    manifest.update_manifest(req.repo, entry)
    return entry.to_dict()


def reference_feeds(spec: ModelSpec, eval_data: Path | None) -> dict:
    """Data for INT8 work, inputs as dicts by name: 'calibration' (may be absent), and 'x', 'y' where labeled.

    Args:
        eval_data: an .npz with one array per input and 'labels' (held-out data of a user model).
    """
    import numpy as np

    data = zoo.reference_data(spec) if spec.builder not in user_models.USER_BUILDERS else {}
    first = spec.inputs[0].name
    feeds = {k: {first: v} for k, v in data.items() if k in ("calibration", "x") and not isinstance(v, dict)}
    out = {**data, **feeds}
    if eval_data is not None:
        with np.load(eval_data, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
        if "labels" not in arrays:
            raise SpecError(f"eval_data {eval_data} has no 'labels' array: save it with numpy.savez(..., labels=y)")
        out.update(x=quantize.calibration_feeds(spec, eval_data, None), y=arrays["labels"])
    return out


def _int8_report(spec: ModelSpec, fp32_path: Path, result: quantize.QuantizeResult, data: dict) -> dict:
    """The INT8 variant's gate: every output against FP32 on the labelled rows (or, without labels, the calibration
    rows), and held-out accuracy where there are labels. Raises ValidationError (nothing written) where it misses."""
    from tpserve.builders.checks.speed import side_by_side

    feeds = data.get("x", data["calibration"])
    batch = {k: v[:32] for k, v in feeds.items()}
    speed = side_by_side({"fp32": fp32_path, "int8": result.path}, batch)
    speedup = round(speed["int8"] / speed["fp32"], 2)
    rows = "the labelled rows" if "y" in data else "the calibration rows"
    figures = _output_agreement(spec, fp32_path, result.path, feeds)
    details = {
        "quantizer": result.quantizer,
        "calibration_samples": result.samples,
        "activations": result.activations,
        "cpu_throughput_batch32": speed,
        "int8_speedup": speedup,
        "slower_than_fp32": speedup < 1,
        "agreement_rows": rows,
        "agreement": spec.agreement.get("int8", {}),
        "outputs": [f.to_dict() for f in figures],
    }
    step(f"{spec.name}: CPU throughput at batch 32, FP32 {speed['fp32']:.0f}/s vs INT8 {speed['int8']:.0f}/s")
    if speedup < 1:
        step(
            f"{spec.name}: INT8 runs at {speedup:.2f}x of FP32 on this host's CPU: slower, it buys nothing here "
            "(the manifest says so: int8.slower_than_fp32; the search measures variants before it chooses one)"
        )
    for f in figures:
        top1 = f", top-1 agreement {f.top1:.3f}" if f.top1 is not None else ""
        cosine = f"cosine {f.cosine:.4f}, relative error {f.relative_error:.4f}" if f.cosine is not None else "exact"
        step(f"{spec.name}: INT8 output {f.output!r} against FP32 on {rows}: {cosine}{top1}")
    report_path = result.path.with_name("validation.int8.json")
    if "y" in data:
        fp32_acc = quantize.onnx_accuracy(fp32_path, data["x"], data["y"])
        int8_acc = quantize.onnx_accuracy(result.path, data["x"], data["y"])
        step(f"{spec.name}: held-out accuracy FP32 {fp32_acc:.4f} vs INT8 {int8_acc:.4f}")
        report = quantize.accuracy_gate(spec, fp32_acc, int8_acc, report_path, details)  # raises where it trails
        report["gate"] = "held-out accuracy and every output against FP32"
    else:
        report = {"model": spec.name, "precision": "int8", "gate": "every output against FP32", **details}
    report["passed"] = all(f.passed for f in figures) and report.get("passed", True)
    report_path.write_text(json.dumps(report, indent=2))
    if not report["passed"]:
        raise ValidationError(agreement.missed_message(spec, "int8", figures, rows, report_path))
    return report


def _output_agreement(spec: ModelSpec, fp32_path: Path, int8_path: Path, feeds: dict, rows: int = 512) -> list:
    """Every output of the INT8 model against the FP32 model's on the same rows (at most `rows` of them)."""
    import onnxruntime as ort

    feeds = {k: v[:rows] for k, v in feeds.items()}
    outs = []
    for path in (fp32_path, int8_path):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        outs.append(dict(zip(names, session.run(names, feeds), strict=True)))
    return agreement.compare(spec, "int8", outs[0], outs[1])


def _manifest_entry(req, config, artifact, report, started) -> manifest.ManifestEntry:
    worst = max((s["max_abs"] for b in report["batches"] for s in b["outputs"].values()), default=0.0)
    return manifest.ManifestEntry(
        name=req.spec.name,
        target=req.target,
        kind=req.options.kind,
        backend=config.backend or config.platform,
        precision="fp32",
        artifact=f"{req.spec.name}/1/model.onnx",
        sha256=artifact.sha256,
        accuracy=artifact.metrics.get("accuracy"),
        metrics=artifact.metrics,
        validation={"passed": report["passed"], "max_abs_error": worst, "atol": report["atol"], "rtol": report["rtol"]},
        spec=req.spec.to_dict(),
        versions=tool_versions(),
        host=host_info(),
        build_seconds=round(time.time() - started, 1),
    )


def build_torch_variant(req: BuildRequest, runtime: repository.TorchRuntime) -> dict:
    """Serve the spec's module with the torch runtime (after build_model made its artifacts).

    The variant carries the module as a torch.export program (model.pt2), so the server needs
    no model source: zoo and user models alike. A runtime with a compiler builds a compiled
    engine (builders/formats/torch_compiled.py): compiled, gated and cached here, not at the first request.
    """
    from tpserve.builders.formats.torch_compiled import build_compiled_variant
    from tpserve.builders.formats.torch_variant import write_torch_variant

    if runtime.compiler:
        return build_compiled_variant(req, runtime)
    entry = write_torch_variant(req, runtime)
    manifest.update_manifest(req.repo, entry)
    return entry.to_dict()
