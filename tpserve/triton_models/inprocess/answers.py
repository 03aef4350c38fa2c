"""What the in-process backend's request paths answer through, and the slots their batches take: explicit
objects an Instance makes and hands to each path (ragged_path.py, tokenize_path.py), so that no path reaches
into the Instance itself.

- Answers: a request's outputs written into its response and sent, or its error; either way its statistics
  reported and the request released (Triton's statistics and the backend's latency histogram).
- Slots: the batches one instance has in flight (two: the next one is read while this one computes), and the
  queue the completion thread takes finished batches from.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpserve.triton_models.inprocess.triton_api import ERROR_INVALID_ARG


@dataclass
class Answers:
    """Answering one instance's requests. write_output(response, name, datatype, tensor) writes one output."""

    api: Any  # the backend's TritonApi
    calls: Any  # the shim's batch calls (batch_calls.BatchCalls), where the library has them
    handle: int  # the instance's
    name: str  # the model's, as errors name it
    outputs: list[tuple[str, str]]  # (name, datatype) of every output, in the model's order
    write_output: Callable
    all_outputs: set[str] = field(init=False)

    def __post_init__(self):
        self.all_outputs = {name for name, _ in self.outputs}

    def answer(self, request: int, outputs: list, times: tuple) -> None:
        """The request's outputs (those it asked for) into its response, sent; then reported and released."""
        api = self.api
        response = api.response_new(request)
        try:
            asked = set(api.requested_outputs(request)) if len(self.outputs) > 1 else None  # one output: no query
            wanted = asked or self.all_outputs
            for (name, datatype), tensor in zip(self.outputs, outputs):
                if name in wanted:
                    self.write_output(response, name, datatype, tensor)
        except Exception as err:
            api.send(response, api.error(ERROR_INVALID_ARG, f"{self.name}: {err}"))
            return self.release(request, False, times)
        api.send(response)
        self.release(request, True, times)

    def fail(self, request: int, err: Exception, start: int) -> None:
        """The request hears why it failed, and is released whatever happens on the way."""
        now = time.monotonic_ns()
        try:
            response = self.api.response_new(request)
            self.api.send(response, self.api.error(getattr(err, "code", ERROR_INVALID_ARG), f"{self.name}: {err}"))
        finally:
            self.release(request, False, (start, now, now))

    def fail_all(self, requests, err: Exception, start: int) -> None:
        for request in requests:
            self.fail(int(request), err, start)

    def release(self, request: int, ok: bool, times: tuple) -> None:
        if self.calls is not None:  # Triton's statistics and the backend's latency histogram (metrics.c)
            self.calls.report(self.handle, request, int(ok), *times, time.monotonic_ns(), 0)
        else:
            self.api.report(self.handle, request, ok, (*times, time.monotonic_ns()))
        self.api.release(request)


class Slots:
    """An instance's batches in flight: take() a slot (it waits while every slot is busy), give() it back when
    the batch is answered; hand_over() a submitted batch to the completion thread, which next() gives it."""

    def __init__(self, count: int):
        self.count = count
        self._free: queue.Queue = queue.Queue()
        for slot in range(count):
            self._free.put(slot)
        self._done: queue.Queue = queue.Queue()

    def take(self) -> tuple[int, bool]:
        """A free slot, and whether it is alone (no other batch in flight: nothing to overlap)."""
        slot = self._free.get()
        return slot, self._free.qsize() == self.count - 1

    def give(self, slot: int) -> None:
        self._free.put(slot)

    def hand_over(self, job) -> None:
        self._done.put(job)

    def next(self):
        """The next batch for the completion thread (None: the instance is closing)."""
        return self._done.get()

    def close(self) -> None:
        self._done.put(None)
