"""A torch-runtime variant's model folder: the spec's module as a torch.export program (model.pt2) that the torch
runtime serves, plus what a compiled engine adds (formats/torch_compiled.py)."""

from __future__ import annotations

import dataclasses
import json

from tpserve.builders.environment import host_info, tool_versions
from tpserve.builders.formats import export
from tpserve.builders.repository import writer
from tpserve.builders.repository.manifest import ManifestEntry
from tpserve.builders.request import BuildRequest
from tpserve.common.cli import step
from tpserve.common.errors import SpecError


def write_torch_variant(req: BuildRequest, runtime: writer.TorchRuntime, extra: dict | None = None) -> ManifestEntry:
    """Write a torch-runtime variant's folder (model.pt2, spec.json, model.py, extra artifacts); return its entry."""
    out_dir = req.work_dir / req.spec.name
    program, spec_file = out_dir / "model.pt2", out_dir / "spec.json"
    if not program.exists():
        raise SpecError(
            f"{req.spec.name}: no torch.export program (model.pt2) in {out_dir}; build the model first "
            "(make build-engines), or, if the build said it could not export one, the torch runtime cannot serve it"
        )
    spec_file.write_text(json.dumps(req.spec.to_dict()))
    config = writer.torch_config(req.spec, runtime, req.options)
    variant = dataclasses.replace(req.spec, name=config.name)
    step(f"{req.spec.name}: writing {req.repo / config.name} (torch runtime, {req.options.kind})")
    from tpserve.triton_models import TORCH_MODEL

    artifacts = {"model.pt2": program, "spec.json": spec_file, "model.py": TORCH_MODEL, **(extra or {})}
    writer.write_model(req.repo, variant, config, artifacts, req.target)
    return ManifestEntry(
        name=config.name,
        target=req.target,
        backend=config.backend or "",
        runtime="inductor" if runtime.compiler else "torch",
        kind=req.options.kind,
        precision=runtime.precision,
        artifact=f"{config.name}/1/model.pt2",
        sha256=export.file_sha256(program),
        spec=req.spec.to_dict(),
        torch_runtime=dataclasses.asdict(runtime),
        versions=tool_versions(),
        host=host_info(),
    )
