"""Admin APIs of the server (restricted: they need the admin key that `make serve` generates)."""

from __future__ import annotations

from builders.errors import ClientError
from clients.connection import Endpoint, refused_as_client_error


def _call(ep: Endpoint, call, what: str):
    if not ep.admin_headers:
        raise ClientError(f"{what} is a restricted API: start the server with `make serve` so its admin key is known")
    with refused_as_client_error(what):
        return call(headers=ep.admin_headers)


def repository_index(ep: Endpoint, client) -> list[dict]:
    """Every model of the repository with its version, state and reason."""
    index = _call(ep, client.get_model_repository_index, "repository index")
    if isinstance(index, dict) or not isinstance(index, list):  # gRPC: a protobuf message
        from google.protobuf import json_format

        index = json_format.MessageToDict(index, preserving_proto_field_name=True).get("models", [])
    return index


def inference_statistics(ep: Endpoint, client, model: str = "") -> list[dict]:
    """Per model (all if model is empty), Triton's inference statistics."""
    stats = _call(ep, lambda headers: client.get_inference_statistics(model, headers=headers), "statistics")
    if not isinstance(stats, dict):
        from google.protobuf import json_format

        stats = json_format.MessageToDict(stats, preserving_proto_field_name=True)
    return stats.get("model_stats", [])
