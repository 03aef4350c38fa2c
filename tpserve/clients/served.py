"""What a server serves, read from its repository: the manifest's models and their specs.

The measurement tools take their default model lists and input shapes from here, so a
user's model gets the same treatment as a zoo model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import ClientError


def _manifest(repo: Path | None) -> dict:
    from tpserve.builders.repository.manifest import read_manifest

    if repo is None:
        return {}
    try:
        return read_manifest(Path(repo)).get("models", {})
    except (OSError, ValueError):
        return {}


def served_spec(repo: Path | None, model: str) -> ModelSpec | None:
    """The spec of a served model (a variant carries the spec it was built from), or None."""
    return Served((model,), _manifest(repo)).spec(model)


def manifest_models(repo: Path | None) -> list[str]:
    """The models that the repository's manifest lists, in build order."""
    models = _manifest(repo)
    return sorted(models, key=lambda m: models[m].get("built_at", ""))


@dataclass(frozen=True)
class Served:
    """What a run measures, read from the server once: the models (given, or the ready ones), each one's spec
    where the repository is ours (none for a server we did not make), the models the server's index listed as
    not ready with its reason, and where the list came from."""

    names: tuple[str, ...]
    manifest: dict[str, dict] = field(default_factory=dict)  # the repository's manifest entries (ours only)
    not_ready: dict[str, str] = field(default_factory=dict)
    source: str = "given"

    def spec(self, model: str) -> ModelSpec | None:
        """The spec a served model was built from (a variant carries its own), or None."""
        entry = self.manifest.get(model)
        return ModelSpec.from_dict(entry["spec"]) if entry and entry.get("spec") else None


def read_served(ep: Endpoint, models: tuple[str, ...] = ()) -> Served:
    """The models given, or the ones to measure by default: the manifest's models that are ready where the
    repository is ours, else every model the server's repository index calls READY (any Triton).

    Raises:
        ClientError: none is ready, or the server lists none to us (its index needs the admin key).
    """
    entries = _manifest(ep.repo)
    if models:
        return Served(tuple(models), entries)
    names = manifest_models(ep.repo)
    if not names:
        ready, not_ready = _index_models(ep)
        return Served(tuple(ready), entries, not_ready, "the server's index")
    with ep.client() as client:
        ready = [n for n in names if _ready(client, n)]
    if not ready:
        raise ClientError(f"none of the manifest's models {names} is ready on {ep.url}; check `make status`")
    return Served(tuple(ready), entries, {}, f"{ep.repo}/manifest.json")


def served_models(ep: Endpoint) -> list[str]:
    """read_served's model names."""
    return list(read_served(ep).names)


def _index_models(ep: Endpoint) -> tuple[list[str], dict[str, str]]:
    """Every model the server's repository index calls READY, sorted, and the others with their reason (printed)."""
    from tpserve.clients.admin import repository_index
    from tpserve.common.cli import step

    try:
        with ep.client() as client:
            entries = repository_index(ep, client)
    except Exception as err:  # restricted without the key, or not Triton
        why = str(err).splitlines()[0]
        raise ClientError(
            f"the server at {ep.url} did not list its models ({why}); name them (MODELS=... or "
            "--models), or give its admin key (--header 'admin-key: ...')"
        ) from None
    not_ready = {}
    for entry in entries:
        if entry.get("state") != "READY":
            why = entry.get("reason") or "no reason given"
            not_ready[entry["name"]] = f"not ready ({entry.get('state', 'UNKNOWN')}: {why})"
            step(f"{entry['name']}: {not_ready[entry['name']]}, not measured")
    ready = sorted({e["name"] for e in entries if e.get("state") == "READY"})
    if not ready:
        raise ClientError(f"the server at {ep.url} has no model ready")
    return ready, not_ready


def variants_of(repo: Path | None, model: str) -> list[str]:
    """A model and the variants built from it (e.g. digits_cnn, digits_cnn_int8), from the manifest."""
    models = _manifest(repo)
    base = models.get(model, {}).get("spec", {}).get("name", model)
    return [m for m in manifest_models(repo) if models[m].get("spec", {}).get("name") == base]


def _ready(client, model: str) -> bool:
    try:
        return bool(client.is_model_ready(model))
    except Exception:  # tritonclient raises on unknown models over gRPC
        return False


def require_ready(ep: Endpoint, names: list[str]) -> None:
    """Check that every named model is ready on the server before a run starts.

    Raises:
        ClientError: a model is unknown or not ready; the message lists what the server has ready.
    """
    from tpserve.clients.admin import repository_index

    with ep.client() as client:
        missing = [n for n in names if not _ready(client, n)]
        if not missing:
            return
        index = repository_index(ep, client)
    ready = sorted(m["name"] for m in index if m.get("state") == "READY")
    raise ClientError(
        f"model(s) {', '.join(missing)} not ready or unknown on {ep.url}; ready there: "
        f"{', '.join(ready) or 'none'} (MODEL=... or --models)"
    )
