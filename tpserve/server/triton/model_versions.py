"""A served model's versions on disk and in the manifest: stage, promote, restore, prune, record.

Every change to the served repository is a rename or an os.replace of a complete file or folder,
so a reader (tritonserver loading, a supervisor restarting it) never sees half of a version.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tpserve.builders.repository.manifest import read_manifest, update_manifest
from tpserve.common.errors import ServerError

CONFIG = "config.pbtxt"
WARMUP = "warmup"  # warmup data files (Triton reads <model>/warmup/<input_data_file>)


def disk_versions(model_dir: Path) -> list[int]:
    """The numbered version folders of a model folder, ascending."""
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def newest_version(model_dir: Path) -> Path:
    """The highest-numbered version folder.

    Raises:
        ServerError: the folder has none.
    """
    versions = disk_versions(model_dir) if model_dir.is_dir() else []
    if not versions:
        raise ServerError(f"{model_dir} has no numbered version folder (e.g. {model_dir}/1/): is it a built model?")
    return model_dir / str(versions[-1])


def copy_in(source: Path, target: Path) -> None:
    """Copy the folder source to target (which must not exist) through a hidden staging copy and one rename."""
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{target.name}-", dir=target.parent))
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        os.chmod(staging, 0o755)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_file(path: Path, data: bytes) -> None:
    """Replace path's content atomically."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def remove(folder: Path) -> None:
    """Take a folder out of the repository by one rename, then delete it."""
    if not folder.exists():
        return
    trash = folder.with_name(f".removed-{folder.name}-{os.getpid()}")
    os.rename(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


@dataclass(frozen=True)
class ModelFiles:
    """The model-level files (config.pbtxt, labels, warmup/ data, ...) of a model folder: what a rollback
    restores. Names are relative to the model folder ("warmup/random_input_ids")."""

    files: dict  # name -> bytes

    @classmethod
    def read(cls, model_dir: Path) -> ModelFiles:
        return cls({name: (model_dir / name).read_bytes() for name in _model_level(model_dir)})

    def write(self, model_dir: Path, config: bytes | None = None) -> None:
        """Write every file (config.pbtxt replaced by config if given); remove model-level files not in it."""
        for name in _model_level(model_dir):
            if name not in self.files:
                (model_dir / name).unlink()
        for name, data in self.files.items():
            (model_dir / name).parent.mkdir(exist_ok=True)
            write_file(model_dir / name, config if name == CONFIG and config is not None else data)


def _model_level(model_dir: Path) -> list[str]:
    """The model folder's own files and those of its warmup/ folder (Triton's input_data_file), as names."""
    found = [p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
    if (model_dir / WARMUP).is_dir():
        found += [p for p in (model_dir / WARMUP).iterdir() if p.is_file() and not p.name.startswith(".")]
    return [str(p.relative_to(model_dir)) for p in found]


def prune(model_dir: Path, keep: int, serving: int) -> list[int]:
    """Delete retired version folders beyond the newest `keep` (never the serving one); return those deleted."""
    retired = [v for v in disk_versions(model_dir) if v != serving]
    doomed = retired[: max(0, len(retired) - (keep - 1))]
    for version in doomed:
        remove(model_dir / str(version))
    return doomed


def record(repo: Path, model: str, event: dict, entry: dict | None = None) -> dict:
    """Append a rollout event to the model's manifest history; with entry, it becomes the model's entry.

    The history starts with the version that was serving before the first rollout.
    """
    current = read_manifest(repo)["models"].get(model, {"name": model})
    history = list(current.get("history") or [_initial(current)])
    if event.get("status") == "serving":
        history = [{**h, "status": "retired"} if h.get("status") == "serving" else h for h in history]
    history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **event})
    updated = {**(entry or current), "name": model, "history": history}
    serving = event.get("status") == "serving"
    updated["served_version"] = event["version"] if serving else current.get("served_version", 1)
    update_manifest(repo, updated)
    return updated


def _initial(entry: dict) -> dict:
    return {
        "at": entry.get("built_at"),
        "version": entry.get("served_version", 1),
        "sha256": entry.get("sha256"),
        "source": "make build-engines",
        "status": "serving",
    }


def versioned_entry(entry: dict, model: str, version: int) -> dict:
    """A build's manifest entry with its artifact path pointing at the served version folder."""
    artifact = entry.get("artifact", "")
    parts = artifact.split("/")
    if len(parts) >= 3 and parts[0] == model and parts[1].isdigit():
        artifact = "/".join([model, str(version), *parts[2:]])
    return {**entry, "artifact": artifact}
