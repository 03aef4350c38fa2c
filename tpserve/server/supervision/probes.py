"""Active probes of served models: one small inference per model at an interval, through the server.

A model can be unhealthy with every process alive: a wedged stub (stopped, deadlocked) answers
nothing, a broken one answers internal errors, while Triton keeps calling the model ready. A probe
that times out or gets a server error (5xx) counts as a failure; an answer, even a refusal of the
zero-filled probe (4xx), counts as alive. `threshold` failures in a row mark the model for a reload.

A busy model is not a hung one: a probe that got no answer (it queued behind a flood, or the model's bounded
queue refused it) counts as alive when the model ran batches since the last round. Triton's statistics say so
(execution count and successes, read outside the model's queue); a wedged stub runs none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SKIPPED = "BYTES"  # pipelines' encoded payloads: their steps are probed instead


@dataclass(frozen=True)
class ProbeSettings:
    interval: float = 10.0  # seconds between rounds; 0 turns probing off
    timeout: float = 5.0
    threshold: int = 3


DEFAULT_PROBES = ProbeSettings()


@dataclass
class ProbeState:
    """Consecutive failures per model, and the probe inputs learned from each model's metadata."""

    failures: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)  # model -> [(name, shape, datatype)] or None (not probed)
    progress: dict = field(default_factory=dict)  # model -> its work count at the last round (work_done)


def probe_inputs(metadata: dict, config: dict) -> list[tuple[str, list[int], str]] | None:
    """Zero-filled inputs of batch 1 for a model, or None for models with BYTES inputs and decoupled models
    (their responses come only over gRPC streaming; an HTTP probe would count as a failure)."""
    if config.get("model_transaction_policy", {}).get("decoupled"):
        return None
    batching = int(config.get("max_batch_size", 0)) > 0
    found = []
    for tensor in metadata["inputs"]:
        if tensor["datatype"] == SKIPPED:
            return None
        shape = [1 if d == -1 else int(d) for d in tensor["shape"]]
        if batching:
            shape[0] = 1
        found.append((tensor["name"], shape, tensor["datatype"]))
    return found


def answered(url: str, model: str, inputs: list, timeout: float) -> bool:
    """Whether the model answered one probe in time (a 4xx refusal is an answer; 5xx and timeouts are not)."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException, triton_to_np_dtype

    tensors = []
    for name, shape, datatype in inputs:
        tensor = http.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(np.zeros(shape, triton_to_np_dtype(datatype)))
        tensors.append(tensor)
    try:
        with http.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout) as client:
            client.infer(model, tensors)
        return True
    except InferenceServerException as err:
        return str(err.status() or "").startswith("4")
    except Exception:  # timeout, reset: no answer
        return False


def record(state: ProbeState, model: str, ok: bool, threshold: int) -> bool:
    """Count a probe's outcome; True when the model reached `threshold` failures in a row (then reset)."""
    state.failures[model] = 0 if ok else state.failures.get(model, 0) + 1
    if state.failures[model] >= threshold:
        state.failures[model] = 0
        return True
    return False


def work_done(url: str, model: str, timeout: float, headers: dict | None = None) -> int | None:
    """How much the model has run so far (batches executed plus requests answered, every version), from Triton's
    statistics; None when they could not be read."""
    import tritonclient.http as http

    try:
        with http.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout) as client:
            stats = client.get_inference_statistics(model, headers=headers)
    except Exception:  # not answering: no evidence of work
        return None
    return sum(
        int(v.get("execution_count", 0)) + int(v.get("inference_stats", {}).get("success", {}).get("count", 0))
        for v in stats.get("model_stats", [])
    )


def busy(state: ProbeState, model: str, done: int | None) -> bool:
    """Whether the model ran work since the last look (done: work_done now); remembers done for the next."""
    before = state.progress.get(model)
    if done is not None:
        state.progress[model] = done
    return done is not None and before is not None and done > before
