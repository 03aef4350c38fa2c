"""What a rollout checks through the server's endpoint before a version takes traffic (gpu-bench runs the
smoke check too, before timing: perf_analyzer does not read outputs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import ClientError


class CheckFailed(Exception):
    """A served version failed a rollout check (the message says which and why)."""


@dataclass(frozen=True)
class Gate:
    """Accuracy limits: the served accuracy may fall `tolerance` below what the build recorded,
    and `budget` below the accuracy of the version serving now."""

    tolerance: float = 0.01
    budget: float = 0.01


def smoke(ep: Endpoint, model: str, version: str, spec: ModelSpec | None, batch: int) -> dict:
    """One request of `batch` example inputs: every output present, of that batch and its dims, finite.

    Raises:
        CheckFailed: the request was refused or an output is missing, malformed, empty or not finite.
    """
    from tpserve.clients.infer import infer, model_outputs
    from tpserve.clients.inputs import plan_inputs
    from tpserve.clients.model_plan import plan

    with ep.client() as client:
        try:
            arrays = plan_inputs(plan(client, model, ep.headers), batch, None, spec)
            dims = {o["name"]: [int(d) for d in o["shape"][1:]] for o in model_outputs(client, model, version)}
            result = infer(ep, model, arrays, client=client, version=version)
        except ClientError as err:
            raise CheckFailed(f"smoke request failed: {err}") from None
        except ValueError as err:  # tritonclient cannot shape an output that came back short or empty
            raise CheckFailed(f"smoke request: an output came back malformed ({err})") from None
    for name, array in result.outputs.items():
        problem = _output_problem(array, batch, dims.get(name))
        if problem:
            raise CheckFailed(f"smoke request: output {name!r} {problem}")
    return {"smoke": "passed", "batch": batch, "latency_ms": round(result.latency_ms, 2)}


def warm_up(
    ep: Endpoint, model: str, version: str, spec: ModelSpec | None, batch: int, seconds: float, users: int
) -> dict:
    """Requests of `batch` example inputs from `users` threads for `seconds`, straight to the server (not through
    the edge, so the edge's figures of a canary step never hold them): a build's first answers (its instances'
    first runs, lazy imports, allocators growing) are slower than its steady ones, and a canary step gated on a
    p99 over a hundred requests would judge those. Failures are counted, not raised: the gate judges errors."""
    import threading
    import time

    from tpserve.clients.infer import infer
    from tpserve.clients.inputs import plan_inputs
    from tpserve.clients.model_plan import plan

    with ep.client() as client:
        arrays = plan_inputs(plan(client, model, ep.headers), batch, None, spec)
    end, counts, lock = time.monotonic() + seconds, {"requests": 0, "failed": 0}, threading.Lock()

    def user():
        with ep.client() as client:
            while time.monotonic() < end:
                try:
                    infer(ep, model, arrays, client=client, version=version)
                    failed = 0
                except ClientError:
                    failed = 1
                with lock:
                    counts["requests"] += 1
                    counts["failed"] += failed

    threads = [threading.Thread(target=user, daemon=True) for _ in range(max(1, users))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return counts


def _output_problem(array, batch: int, dims: list[int] | None = None) -> str | None:
    if array is None or array.size == 0:
        return "is empty"
    if batch and array.shape[0] != batch:
        return f"has batch {array.shape[0]}, expected {batch}"
    if batch and dims and min(dims) > 0 and list(array.shape[1:]) != dims:
        return f"has shape {list(array.shape)}, expected {[batch, *dims]}"
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return "holds NaN or infinity"
    return None


def labeled_data(spec: ModelSpec | None) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(input name, x, y) of the spec's held-out labeled data, where the builder has some."""
    from tpserve.builders.spec import zoo

    if spec is None:
        return None
    data = zoo.reference_data(spec)
    if "x" not in data or "y" not in data or isinstance(data["x"], dict):
        return None
    return spec.inputs[0].name, data["x"], data["y"]


def served_accuracy(ep: Endpoint, model: str, version: str, data: tuple, max_batch: int) -> float:
    """Top-1 accuracy of one served version on (input, x, y), in requests of up to max_batch samples.

    Raises:
        CheckFailed: a request was refused.
    """
    from tpserve.clients.infer import infer

    name, x, y = data
    step = max(1, max_batch)
    hits = 0
    with ep.client() as client:
        for start in range(0, len(x), step):
            try:
                result = infer(ep, model, {name: x[start : start + step]}, client=client, version=version)
            except ClientError as err:
                raise CheckFailed(f"accuracy request failed: {err}") from None
            logits = next(iter(result.outputs.values()))
            hits += int((logits.reshape(len(logits), -1).argmax(1) == y[start : start + step]).sum())
    return hits / len(x)


def accuracy_gate(measured: float, recorded: float | None, serving: float | None, gate: Gate) -> dict:
    """Judge a measured accuracy against the build's record and the serving version's.

    Raises:
        CheckFailed: below the record by more than the tolerance, or below the serving version by more than the budget.
    """
    if recorded is not None and measured < recorded - gate.tolerance:
        raise CheckFailed(
            f"served accuracy {measured:.4f} is {recorded - measured:.4f} below the {recorded:.4f} its build recorded "
            f"(tolerance {gate.tolerance}): the artifact does not behave as built"
        )
    if serving is not None and measured < serving - gate.budget:
        raise CheckFailed(
            f"served accuracy {measured:.4f} is {serving - measured:.4f} below the serving version's {serving:.4f} "
            f"(budget {gate.budget}); raise --accuracy-budget to accept it"
        )
    return {"accuracy": round(measured, 4), "recorded": recorded, "serving": serving}
