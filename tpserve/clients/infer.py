"""One inference call over HTTP or gRPC, with optional top-k through Triton's classification extension."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from tpserve.clients.connection import refused_as_client_error
from tpserve.common.endpoints import Endpoint


@dataclass
class InferResult:
    """Outputs by name; for top-k, per sample a list of (score, class index, label)."""

    outputs: dict
    top_k: list | None
    latency_ms: float


def model_inputs(client, model: str, headers: dict | None = None) -> list[dict]:
    """The model's inputs from its metadata: name, datatype, shape (batch axis first)."""
    with refused_as_client_error(model):
        meta = client.get_model_metadata(model, headers=headers or None)
    inputs = meta["inputs"] if isinstance(meta, dict) else meta.inputs
    return [_as_dict(i) for i in inputs]


def model_outputs(client, model: str, version: str = "", headers: dict | None = None) -> list[dict]:
    """The model's outputs from its metadata (of one version if given)."""
    with refused_as_client_error(model):
        meta = client.get_model_metadata(model, version, headers=headers or None)
    outputs = meta["outputs"] if isinstance(meta, dict) else meta.outputs
    return [_as_dict(o) for o in outputs]


def _as_dict(tensor) -> dict:
    if isinstance(tensor, dict):
        return tensor
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def build_request(module, arrays: dict, outputs: list[str], top_k: int = 0):
    """tritonclient InferInput/InferRequestedOutput objects (top-k on the first output)."""
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = [module.InferRequestedOutput(n, class_count=top_k if i == 0 else 0) for i, n in enumerate(outputs)]
    return inputs, requested


def parse_top_k(raw: np.ndarray) -> list[list[tuple[float, int, str]]]:
    """Triton's 'score:index:label' strings → per sample, (score, index, label) tuples."""
    rows = raw.reshape(raw.shape[0], -1) if raw.ndim > 1 else raw.reshape(1, -1)
    parsed = []
    for row in rows:
        entries = []
        for item in row:
            score, index, *label = item.decode().split(":", 2)
            entries.append((float(score), int(index), label[0] if label else ""))
        parsed.append(entries)
    return parsed


def infer(
    ep: Endpoint,
    model: str,
    arrays: dict,
    top_k: int = 0,
    client=None,
    version: str = "",
    sequence: tuple[int, bool, bool] | None = None,
) -> InferResult:
    """Send one request (to one version if given, else the server's choice); return outputs and latency.

    Raises:
        ClientError: the server refused the request (message and status from the server).
    """
    owned = client is None
    client = client or ep.client()
    try:
        names = [o["name"] for o in model_outputs(client, model, version, ep.headers)]
        inputs, requested = build_request(ep.module(), arrays, names, top_k)
        start = time.perf_counter()
        with refused_as_client_error(model):
            seq = dict(zip(("sequence_id", "sequence_start", "sequence_end"), sequence)) if sequence else {}
            result = client.infer(
                model, inputs, model_version=version, outputs=requested, headers=ep.request_headers(), **seq
            )
        latency = (time.perf_counter() - start) * 1e3
    finally:
        if owned:
            client.close()
    outputs = {n: result.as_numpy(n) for n in names}
    ranked = parse_top_k(outputs.pop(names[0])) if top_k else None
    return InferResult(outputs, ranked, latency)
