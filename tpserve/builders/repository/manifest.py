"""manifest.json: what each model of a repository was built from, how it was checked, and where it runs.

Entries are typed records (ManifestEntry). The file carries a format_version; manifests written before it
(no format_version) read as version 1, whose entries have the same keys. Keys a reader does not know (a newer
writer's) are kept in `extra` and written back as they were.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpserve.common.errors import ConfigError

MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # 1: no format_version key (before typed entries); 2: this layout
ALWAYS = ("accuracy",)  # written even when None: readers index it


@dataclass(frozen=True, kw_only=True)
class ManifestEntry:
    """One model or variant of the repository."""

    name: str
    target: str  # embedded or ngc
    backend: str  # python, onnxruntime, tensorrt_plan, ...
    precision: str
    spec: dict  # the ModelSpec it was built from (ModelSpec.to_dict)
    versions: dict  # tool versions that built it
    host: dict  # the build host
    built_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    artifact: str | None = None  # the served file, relative to the repository
    sha256: str | None = None
    kind: str | None = None  # KIND_CPU or KIND_GPU
    runtime: str | None = None  # torch-runtime variants: torch or inductor
    torch_runtime: dict | None = None
    accuracy: float | None = None
    metrics: dict | None = None
    validation: dict | None = None  # the numerics gate it passed
    int8: dict | None = None  # INT8: calibration, agreement, speed
    compiled: dict | None = None  # torch.compile engines: compiler versions, device, GPU, cache size
    engines: dict | None = None  # TensorRT: one plan per compute capability
    timing: dict | None = None
    max_batch_size: int | None = None
    build_seconds: float | None = None
    served_version: int | None = None  # rollouts: the version folder serving
    history: list | None = None  # rollouts: every version rolled in, rejected or rolled back
    extra: dict = field(default_factory=dict)  # keys this version does not know, kept as they are

    def to_dict(self) -> dict:
        known = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**{k: v for k, v in known.items() if v is not None or k in ALWAYS}, **self.extra}

    @classmethod
    def from_dict(cls, data: dict) -> ManifestEntry:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        try:
            return cls(
                **{k: v for k, v in data.items() if k in names}, extra={k: v for k, v in data.items() if k not in names}
            )
        except TypeError as err:
            raise ConfigError(f"manifest entry {data.get('name', '?')!r} is incomplete ({err}): rebuild it") from None


def read_manifest(repo: Path) -> dict:
    """The repository's manifest as a dict, upgraded to FORMAT_VERSION (empty if there is none yet)."""
    path = repo / MANIFEST
    if not path.exists():
        return {"format_version": FORMAT_VERSION, "models": {}}
    data = json.loads(path.read_text())
    version = data.get("format_version", 1)
    if version > FORMAT_VERSION:
        raise ConfigError(
            f"{path} has format_version {version}; this version reads up to {FORMAT_VERSION}: update this project"
        )
    return {**data, "format_version": FORMAT_VERSION}


def entries(repo: Path) -> dict[str, ManifestEntry]:
    """The manifest's entries as typed records, by model name."""
    return {name: ManifestEntry.from_dict(entry) for name, entry in read_manifest(repo)["models"].items()}


def update_manifest(repo: Path, entry: ManifestEntry | dict) -> None:
    """Add or replace one model's entry in manifest.json, writing atomically."""
    record = entry.to_dict() if isinstance(entry, ManifestEntry) else entry
    manifest = read_manifest(repo)
    manifest["models"][record["name"]] = record
    partial = repo / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(partial, repo / MANIFEST)
