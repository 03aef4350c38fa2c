"""Decoupled models over gRPC streaming, and stateful models as sequences.

A decoupled model answers one request with any number of responses, then a final flag; only gRPC
streaming carries them. stream_infer sends one request on a stream and counts what comes back, with the
time to the first and to the last response. A sequence-batched model keeps state per correlation id:
sequence_ids hands out ids, and the requests of one sequence carry start on the first and end on the last.
"""

from __future__ import annotations

import itertools
import os
import queue
import time
from dataclasses import dataclass

from tpserve.common.errors import ClientError


@dataclass(frozen=True)
class StreamResult:
    responses: int  # responses with outputs (the empty final one not counted)
    first_ms: float
    last_ms: float
    outputs: dict  # of the last response with outputs


def stream_infer(ep, model: str, arrays: dict, timeout: float = 60.0, client=None) -> StreamResult:
    """One request to a decoupled model on a gRPC stream; every response until the final flag.

    Raises:
        ClientError: not gRPC, an error response, or no final response within timeout.
    """
    if ep.protocol != "grpc":
        raise ClientError(f"{model} is decoupled: its responses come only over gRPC streaming (--protocol grpc)")
    from tpserve.clients.infer import build_request

    owned = client is None
    answers: queue.Queue = queue.Queue()
    client = client or ep.client()
    try:
        inputs, _ = build_request(ep.module(), arrays, [])
        client.start_stream(
            callback=lambda result, error: answers.put((time.perf_counter(), result, error)),
            headers=ep.request_headers(),
        )
        started = time.perf_counter()
        try:
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        except Exception:  # the stream already ended (a server that refuses streams): its callback says why
            pass
        return _collect(answers, model, started, timeout)
    finally:
        client.stop_stream()
        if owned:
            client.close()


def _collect(answers: queue.Queue, model: str, started: float, timeout: float) -> StreamResult:
    count, first, last, outputs = 0, None, None, {}
    while True:
        try:
            at, result, error = answers.get(timeout=timeout)
        except queue.Empty:
            raise ClientError(f"{model}: no final response within {timeout:.0f} s ({count} responses)") from None
        if error is not None:
            raise ClientError(f"{model}: the server answered with an error: {error}{_streaming_hint(error)}")
        response = result.get_response()
        final = response.parameters.get("triton_final_response")
        if response.outputs:
            count, last = count + 1, at
            first = first or at
            outputs = {o.name: result.as_numpy(o.name) for o in response.outputs}
        if final is not None and final.bool_param:
            end = last or at
            return StreamResult(count, ((first or end) - started) * 1e3, (end - started) * 1e3, outputs)


def _streaming_hint(error) -> str:
    """Where the server refused the stream itself (ours does unless started with --grpc-streaming), how to serve it."""
    if "ModelStreamInfer is not served here" not in str(error):
        return ""
    return " (a server this project starts serves gRPC streams with GRPC_STREAMING=1 / --grpc-streaming)"


_IDS = itertools.count(1)


def sequence_ids() -> int:
    """A correlation id unique to this process and call (the process id keeps workers apart)."""
    return (os.getpid() % 100_000) * 1_000_000 + next(_IDS)
