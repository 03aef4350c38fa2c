"""Calls nobody waits for, answered without running: the model side of the edge's cancelled-calls table.

The edge gives every call an id (x-edge-call, 16 hex digits) that tritonserver passes to the model as a request
parameter, and writes the id of every call that ended without an answer (the client cancelled it, hung up or
timed out) into a table in the server's state folder: slot id % SLOTS holds the id (server/edge/cancel_notice.c). A
Python-backend model checks its batch's ids before it computes and answers a cancelled request at once with
CANCELLED; the rest run as before. Outside the edge (no table, no ids) nothing changes.
"""

from __future__ import annotations

import json
import mmap
import os
import struct

VARIABLE = "TRITON_CANCELLED_CALLS"  # the table's path, set by the launcher (server/edge/cancel_table.py)
PARAMETER = "x-edge-call"
SLOTS = 1 << 18
SLOT = struct.Struct("=Q")  # one slot: a uint64 in the host's byte order, as the C side writes it
WHY = "cancelled: the client stopped waiting for this call, so it was not run"


class CancelledCalls:
    """The table, mapped read-only. Read with struct, not numpy: a numpy lookup took 35-40 µs a batch inside a
    stub, a tenth of a small model's whole request on a 2-core host."""

    def __init__(self, path: str):
        with open(path, "rb") as handle:
            self.table = mmap.mmap(handle.fileno(), SLOTS * SLOT.size, prot=mmap.PROT_READ)

    @classmethod
    def from_environment(cls) -> CancelledCalls | None:
        """The table the launcher named, or None (not behind the edge, or no table)."""
        path = os.environ.get(VARIABLE, "")
        try:
            return cls(path) if path and os.path.getsize(path) == SLOTS * 8 else None
        except (OSError, ValueError):
            return None

    def cancelled(self, ids: list[tuple[int, ...]]) -> list[bool]:
        """Whether any of each request's ids is in the table."""
        table, read, size = self.table, SLOT.unpack_from, SLOT.size
        return [any(read(table, (i % SLOTS) * size)[0] == i for i in own) for own in ids]


PAIRS = json.JSONDecoder(object_pairs_hook=list)  # every key as it came, a repeated one too


def call_ids(request) -> tuple[int, ...]:
    """The edge's id of a request's call, as every parameter of that name (any case) gives it: () where it has none.
    A client may bring a parameter of the name too (gRPC's request parameters, which the front does not read): all
    count, so that one cannot hide the call's own id, whatever order tritonserver hands them over in."""
    try:
        text = request.parameters()
    except Exception:  # a stub without request parameters
        return ()
    if PARAMETER not in text.lower():
        return ()
    try:
        pairs = PAIRS.decode(text)
    except ValueError:
        return ()
    found = (_hex_id(v) for k, v in pairs if k.lower() == PARAMETER) if isinstance(pairs, list) else ()
    return tuple(i for i in found if i)


def _hex_id(value) -> int:
    """16 hex digits as the id they write; 0 for anything else."""
    try:
        return int(value, 16) if isinstance(value, str) and len(value) == 16 else 0
    except ValueError:
        return 0


def serve_live(requests, table: CancelledCalls | None, execute, pb_utils):
    """execute(requests) for the requests someone still waits for; each cancelled one answered at once with
    CANCELLED. Returns what execute returns where nothing was cancelled; else answers every request through its
    response sender and returns None."""
    if table is None or not requests:
        return execute(requests)
    code = getattr(pb_utils.TritonError, "CANCELLED", pb_utils.TritonError.UNAVAILABLE)
    gone = table.cancelled([call_ids(r) for r in requests])
    return answer_apart(requests, [(code, WHY) if g else None for g in gone], execute, pb_utils)


def answer_apart(requests, refusals: list, execute, pb_utils):
    """execute(requests) for those whose refusal is None; each other one answered at once with its (code,
    message) error, unrun. Returns what execute returns where none is refused; else answers every request through
    its response sender and returns None."""
    if not any(refusals):
        return execute(requests)
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    for request, refusal in zip(requests, refusals):
        if refusal:
            error = pb_utils.TritonError(refusal[1], refusal[0])
            request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=final)
    live = [r for r, refusal in zip(requests, refusals) if not refusal]
    answers = execute(live) if live else None
    for request, response in zip(live, answers or []):
        request.get_response_sender().send(response, flags=final)
    return None


def answer_checked(requests, read, checks, batching: bool, execute, pb_utils, *, seen=lambda inputs: inputs):
    """execute(requests, inputs) for the requests whose inputs fit the model's declaration (checks: InputChecks, or
    None for none); each other one answered alone with why, unrun. read(request) gives a request's inputs, read
    once; seen(inputs) is what checks reads of them (name -> array-like)."""
    inputs = {id(r): read(r) for r in requests}
    refusals: list = [None] * len(requests)
    if checks is not None:
        invalid = pb_utils.TritonError.INVALID_ARG
        whys = (checks.why_not(seen(inputs[id(r)]), batching) for r in requests)
        refusals = [(invalid, why) if why else None for why in whys]
    return answer_apart(requests, refusals, lambda live: execute(live, [inputs[id(r)] for r in live]), pb_utils)
