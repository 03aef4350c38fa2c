"""Locust users that drive Triton through tritonclient, over HTTP or gRPC.

Import this module only from a locustfile: it initializes gevent for gRPC first, as
grpc's gevent integration requires before any channel exists.
"""

from __future__ import annotations

import os
import time

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

from locust import User, constant_throughput, events, task  # noqa: E402

from clients.connection import Endpoint, refused_as_client_error  # noqa: E402
from clients.infer import build_request, model_inputs, model_outputs  # noqa: E402
from clients.inputs import example_inputs  # noqa: E402
from clients.served import served_spec  # noqa: E402

PROTOCOL = os.environ.get("TRITON_PROTOCOL", "http")
HTTP_URL = os.environ.get("TRITON_HTTP_URL", "127.0.0.1:8000")
GRPC_URL = os.environ.get("TRITON_GRPC_URL", "127.0.0.1:8001")
BATCH = int(os.environ.get("TRITON_BATCH", "1"))
RATE = float(os.environ.get("TRITON_RATE_PER_USER", "0"))  # requests/s per user; 0: closed loop
REPO = os.environ.get("TRITON_REPO") or None  # the served repository: input shapes and values from its manifest


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
        self.endpoint = Endpoint(self.protocol, url)
        self.triton = self.endpoint.client()
        with refused_as_client_error(self.model):
            inputs = model_inputs(self.triton, self.model)
            self.output_names = [o["name"] for o in model_outputs(self.triton, self.model)]
        self.arrays = example_inputs(inputs, self.batch, served_spec(REPO, self.model))
        self.request_bytes = sum(sum(len(v) for v in a.flat) if a.dtype == object else a.nbytes
                                 for a in self.arrays.values())  # fmt: skip

    def on_stop(self):
        self.triton.close()

    @task
    def infer(self):
        inputs, outputs = build_request(self.endpoint.module(), self.arrays, self.output_names)
        start, error = time.perf_counter(), None
        try:
            self.triton.infer(self.model, inputs, outputs=outputs)
        except Exception as err:  # reported to Locust as a failure, never raised into gevent
            error = err
        events.request.fire(
            request_type=self.protocol.upper(),
            name=f"{self.model} b{self.batch}",
            response_time=(time.perf_counter() - start) * 1000,
            response_length=self.request_bytes,
            exception=error,
            context={},
        )


def user_for(model: str, weight: int = 1, protocol: str = PROTOCOL) -> type:
    """A concrete TritonUser class for one model."""
    name = f"{model.title().replace('_', '')}{protocol.title()}User"
    fields = {"model": model, "weight": weight, "protocol": protocol, "abstract": False, "__module__": __name__}
    return type(name, (TritonUser,), fields)
