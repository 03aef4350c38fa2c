"""Locust users that drive Triton through tritonclient, over HTTP or gRPC.

Import this module only from a locustfile: it initializes gevent for gRPC first, as
grpc's gevent integration requires before any channel exists.
"""

from __future__ import annotations

import os
import time

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from locust import User, constant_throughput, events, task  # noqa: E402

from tpserve.clients.given_data import given_rows, request_of  # noqa: E402
from tpserve.clients.infer import build_request  # noqa: E402
from tpserve.clients.inputs import plan_inputs  # noqa: E402
from tpserve.clients.model_plan import plan  # noqa: E402
from tpserve.clients.served import served_spec  # noqa: E402
from tpserve.clients.streaming import sequence_ids, stream_infer  # noqa: E402
from tpserve.common.endpoints import GRPC_PORT, HTTP_PORT, Endpoint  # noqa: E402
from tpserve.loadtest.locust_suite.failures import RequestFailed  # noqa: E402

PROTOCOL = os.environ.get("TRITON_PROTOCOL", "http")
HTTP_URL = os.environ.get("TRITON_HTTP_URL", f"127.0.0.1:{HTTP_PORT}")
GRPC_URL = os.environ.get("TRITON_GRPC_URL", f"127.0.0.1:{GRPC_PORT}")
BATCH = int(os.environ.get("TRITON_BATCH", "1"))
RATE = float(os.environ.get("TRITON_RATE_PER_USER", "0"))  # requests/s per user; 0: closed loop
REPO = (
    Path(os.environ["TRITON_REPO"]) if os.environ.get("TRITON_REPO") else None
)  # the served repository: input shapes and values from its manifest
SHAPES = json.loads(os.environ.get("TRITON_SHAPES") or "{}")  # dynamic dims: {input: [d1, d2]}
INPUT_DATA = os.environ.get("TRITON_INPUT_DATA") or None  # the user's data (.npz or perf_analyzer JSON)
LENGTHS = os.environ.get("TRITON_LENGTHS", "lognormal")  # token and text models: sentence lengths per request
SEQUENCE_LENGTH = int(os.environ.get("TRITON_SEQUENCE_LENGTH", "10"))  # requests per sequence (stateful models)
TLS = os.environ.get("TRITON_TLS") == "1"
CA_FILE = os.environ.get("TRITON_CA_FILE") or None
HEADERS_FILE = os.environ.get("TRITON_HEADERS_FILE")  # a file (0600), never the environment: headers may be secret


OPEN_CLIENTS: list = []  # every client a user opened and has not closed: closed at Locust's quit, below


def _headers() -> dict:
    return json.loads(Path(HEADERS_FILE).read_text()) if HEADERS_FILE else {}


@events.quit.add_listener
def _close_clients(**_) -> None:
    """Close the clients users left open, once they have all stopped (Locust fires quit after stopping them and
    before it exits). A user stopped in its on_start, or killed after the stop timeout, never closes its client,
    and a gRPC client left to the interpreter's exit is closed from __del__ as gevent goes away: that close can
    block for good (seen: Locust printed its summary and never exited, stuck in grpc's Channel._close)."""
    while OPEN_CLIENTS:
        client = OPEN_CLIENTS.pop()
        try:
            client.close()
        except Exception:  # closing is all that is left to do; one that fails must not keep the others open
            pass


class TritonUser(User):
    """Sends one model's inference requests; each call is reported as a Locust request."""

    abstract = True
    model: str = ""
    protocol: str = PROTOCOL
    batch: int = BATCH
    if RATE > 0:
        wait_time = constant_throughput(RATE)

    def on_start(self):
        url = HTTP_URL if self.protocol == "http" else GRPC_URL
        self.endpoint = Endpoint(self.protocol, url, headers=_headers(), tls=TLS, ca_file=CA_FILE)
        self.triton = self.endpoint.client()
        OPEN_CLIENTS.append(self.triton)
        self.plan = plan(self.triton, self.model, self.endpoint.headers)
        self.output_names = list(self.plan.outputs)
        self.workload = text_requests(self.plan, self.batch) if not (INPUT_DATA or SHAPES) else None
        self.rows = given_rows(Path(INPUT_DATA), self.plan, self.batch) if INPUT_DATA else None
        self.arrays = (
            request_of(self.rows, 0, self.batch, self.plan.batching)
            if self.rows
            else self.workload[0]
            if self.workload
            else plan_inputs(self.plan, self.batch, SHAPES, served_spec(REPO, self.model))
        )
        self.request_bytes = _bytes(self.arrays)
        self.drawn = 0
        self.sequence, self.in_sequence = sequence_ids(), 0

    def on_stop(self):
        if getattr(self, "triton", None) in OPEN_CLIENTS:  # stopped before on_start opened it: nothing to close
            OPEN_CLIENTS.remove(self.triton)
            self.triton.close()

    @task
    def infer(self):
        if self.plan.decoupled:
            return self._stream()
        if self.workload:  # the next request of the length distribution
            self.arrays = self.workload[self.drawn % len(self.workload)]
            self.request_bytes, self.drawn = _bytes(self.arrays), self.drawn + 1
        elif self.rows and len(self.rows) > 1:  # the next rows of the user's data, as perf_analyzer takes them
            self.arrays = request_of(self.rows, self.drawn, self.batch, self.plan.batching)
            self.request_bytes, self.drawn = _bytes(self.arrays), self.drawn + 1
        inputs, outputs = build_request(self.endpoint.module(), self.arrays, self.output_names)
        start, error = time.perf_counter(), None
        try:
            self.triton.infer(
                self.model, inputs, outputs=outputs, headers=self.endpoint.request_headers(), **self._sequence_flags()
            )
        except Exception as err:  # reported to Locust as a failure, never raised into gevent
            error = err
        self._report(f"{self.model} b{self.batch}", (time.perf_counter() - start) * 1000, error)

    def _sequence_flags(self) -> dict:
        """Stateful models: every request of a user belongs to its current sequence; start and end flagged."""
        if not self.plan.sequence:
            return {}
        position = self.in_sequence
        self.in_sequence = (position + 1) % SEQUENCE_LENGTH
        if position == 0:
            self.sequence = sequence_ids()
        return {
            "sequence_id": self.sequence,
            "sequence_start": position == 0,
            "sequence_end": position == SEQUENCE_LENGTH - 1,
        }

    def _stream(self):
        """Decoupled models: one request on the user's gRPC stream; time to the first and to the last response."""
        start, error, result = time.perf_counter(), None, None
        try:
            result = stream_infer(self.endpoint, self.model, self.arrays, client=self.triton)
        except Exception as err:  # reported as a failure
            error = err
        elapsed = (time.perf_counter() - start) * 1000
        self._report(f"{self.model} b{self.batch} first response", result.first_ms if result else elapsed, error)
        self._report(
            f"{self.model} b{self.batch} last response",
            result.last_ms if result else elapsed,
            error,
            result.responses if result else 0,
        )

    def _report(self, name: str, ms: float, error, length: int | None = None) -> None:
        events.request.fire(
            request_type=self.protocol.upper(),
            name=name,
            response_time=ms,
            response_length=self.request_bytes if length is None else length,
            exception=None if error is None else RequestFailed.of(error),
            context={},
        )


def _bytes(arrays: dict) -> int:
    return sum(sum(len(v) for v in a.flat) if a.dtype == object else a.nbytes for a in arrays.values())


def text_requests(model_plan, batch: int) -> list[dict] | None:
    """Token and text models: requests drawn from TRITON_LENGTHS, each user its own seed (None for others)."""
    import random

    from tpserve.loadtest.workloads.text import workload_requests

    return workload_requests(model_plan, served_spec(REPO, model_plan.name), LENGTHS, batch, random.randrange(2**31))


def user_for(model: str, weight: int = 1, protocol: str = PROTOCOL) -> type:
    """A concrete TritonUser class for one model."""
    name = f"{model.title().replace('_', '')}{protocol.title()}User"
    fields = {"model": model, "weight": weight, "protocol": protocol, "abstract": False, "__module__": __name__}
    return type(name, (TritonUser,), fields)
