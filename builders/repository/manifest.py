"""manifest.json: what each model of a repository was built from, how it was checked, and where it runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST = "manifest.json"


def read_manifest(repo: Path) -> dict:
    """The repository's manifest (empty if there is none yet)."""
    path = repo / MANIFEST
    if not path.exists():
        return {"models": {}}
    return json.loads(path.read_text())


def update_manifest(repo: Path, entry: dict) -> None:
    """Add or replace one model's entry in manifest.json, writing atomically."""
    manifest = read_manifest(repo)
    manifest["models"][entry["name"]] = entry
    partial = repo / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(partial, repo / MANIFEST)
