"""Admin APIs of the server (restricted: they need the admin key that `make serve` generates)."""

from __future__ import annotations

from tpserve.clients.connection import as_dict, refused_as_client_error
from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import ClientError


def _call(ep: Endpoint, call, what: str):
    """An admin call with the admin key where it is known (and the endpoint's headers); a server that locks the
    API refuses it without the key, and the message says so."""
    try:
        with refused_as_client_error(what):
            return call(headers={**ep.headers, **ep.admin_headers} or None)
    except ClientError as err:
        if ep.admin_headers:
            raise
        raise ClientError(
            f"{err}; {what} is a restricted API where the server locks it: `make serve` knows its own "
            "key; for another server give it (--header 'admin-key: ...')"
        ) from None


def repository_index(ep: Endpoint, client) -> list[dict]:
    """Every model of the repository with its version, state and reason."""
    index = _call(ep, client.get_model_repository_index, "repository index")
    return index if isinstance(index, list) else as_dict(index).get("models", [])  # gRPC: a protobuf message


def inference_statistics(ep: Endpoint, client, model: str = "") -> list[dict]:
    """Per model (all if model is empty), Triton's inference statistics."""
    stats = _call(ep, lambda headers: client.get_inference_statistics(model, headers=headers), "statistics")
    return as_dict(stats).get("model_stats", [])
