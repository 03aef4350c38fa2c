"""Locustfile: replay a recording, open loop (`make replay`).

One user walks the schedule in TRITON_REPLAY_SCHEDULE (loadtest/workloads/recorded.py) and sends each request at
its offset in a greenlet of its own, whatever the earlier ones are doing. A request whose recording kept its body
is sent as that body, over the protocol it was recorded on; the others get inputs of the recorded shapes. Every
answer is a Locust request (named by model) and a line of TRITON_REPLAY_RESULTS; the run quits when the last
answer is in.
"""

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import base64  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
from locust import User, constant, events, task  # noqa: E402
from locust.exception import StopUser  # noqa: E402

from tpserve.clients.infer import build_request  # noqa: E402
from tpserve.clients.served import served_spec  # noqa: E402
from tpserve.common.endpoints import Endpoint  # noqa: E402
from tpserve.common.errors import RecordingError  # noqa: E402
from tpserve.loadtest.locust_suite import loop_time  # noqa: E402, F401  (the run's clock)
from tpserve.loadtest.locust_suite.failures import RequestFailed  # noqa: E402
from tpserve.loadtest.workloads.recorded import dispatch, read_schedule, synthetic_inputs  # noqa: E402

SCHEDULE = os.environ.get("TRITON_REPLAY_SCHEDULE", "")
RESULTS = os.environ.get("TRITON_REPLAY_RESULTS", "")
URLS = {"http": os.environ.get("TRITON_HTTP_URL", ""), "grpc": os.environ.get("TRITON_GRPC_URL", "")}
REPO = Path(os.environ["TRITON_REPO"]) if os.environ.get("TRITON_REPO") else None
TLS = os.environ.get("TRITON_TLS") == "1"
CA_FILE = os.environ.get("TRITON_CA_FILE") or None
HEADERS_FILE = os.environ.get("TRITON_HEADERS_FILE")  # a 0600 file, never the environment
CONNECTIONS = int(os.environ.get("TRITON_REPLAY_CONNECTIONS", "64"))
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


class Senders:
    """One client per protocol (tritonclient for made-up inputs, raw sends for recorded bodies)."""

    def __init__(self):
        self.headers = json.loads(Path(HEADERS_FILE).read_text()) if HEADERS_FILE else {}
        self.endpoints = {p: Endpoint(p, u, headers=self.headers, tls=TLS, ca_file=CA_FILE) for p, u in URLS.items()}
        self.clients, self.raw, self.arrays = {}, {}, {}

    def client(self, protocol: str):
        if protocol not in self.clients:
            extra = {"concurrency": CONNECTIONS} if protocol == "http" else {}
            self.clients[protocol] = self.endpoints[protocol].client(**extra)
        return self.clients[protocol]

    def close(self) -> None:
        """Every client and channel closed: an open gRPC channel keeps the process from exiting. Once: a second
        call (Locust's quit, below, after the replay closed them itself) has nothing left to close."""
        clients, raw, self.clients, self.raw = self.clients, self.raw, {}, {}
        for client in clients.values():
            client.close()
        for name, sender in raw.items():
            (sender.close if name == "http" else self.channel.close)()

    def send(self, item) -> str:
        """Send one item; 'ok' or what went wrong."""
        if item.values and item.values.get("body"):
            return self._send_body(item, base64.b64decode(item.values["body"]))
        key = (item.model, item.inputs)
        if key not in self.arrays:
            self.arrays[key] = synthetic_inputs(item, served_spec(REPO, item.model))
        module = self.endpoints[item.protocol].module()
        inputs, outputs = build_request(module, self.arrays[key], [])
        headers = self.endpoints[item.protocol].request_headers()
        self.client(item.protocol).infer(
            item.model, inputs, model_version=item.version, outputs=outputs or None, headers=headers
        )
        return "ok"

    def _send_body(self, item, body: bytes) -> str:
        if item.protocol == "grpc":
            call = self._raw_grpc()
            call(body, metadata=tuple(self.headers.items()) or None, timeout=120)
            return "ok"
        return self._post(item, body)

    def _raw_grpc(self):
        if "grpc" not in self.raw:
            import grpc

            url = self.endpoints["grpc"].url
            options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
            if TLS:
                roots = Path(CA_FILE).read_bytes() if CA_FILE else None
                channel = grpc.secure_channel(url, grpc.ssl_channel_credentials(roots), options)
            else:
                channel = grpc.insecure_channel(url, options)
            self.channel = channel
            self.raw["grpc"] = channel.unary_unary(GRPC_INFER)  # bytes in, bytes out
        return self.raw["grpc"]

    def _post(self, item, body: bytes) -> str:
        from geventhttpclient import HTTPClient

        if "http" not in self.raw:
            url = self.endpoints["http"].url
            host, _, port = url.rpartition(":")
            ssl: dict[str, Any] = (
                {"ssl": True, "ssl_options": {"ca_certs": CA_FILE} if CA_FILE else None} if TLS else {}
            )
            self.raw["http"] = HTTPClient(host, int(port), concurrency=CONNECTIONS, network_timeout=120, **ssl)
        version = f"/versions/{item.version}" if item.version else ""
        headers = dict(self.headers)
        if item.values.get("header_length"):
            headers["Inference-Header-Content-Length"] = str(item.values["header_length"])
        answer = self.raw["http"].post(f"/v2/models/{item.model}{version}/infer", body=body, headers=headers)
        answer.read()
        return "ok" if answer.status_code == 200 else f"http {answer.status_code}"


OPEN_SENDERS: list[Senders] = []  # closed at Locust's quit too: a replay stopped early (SIGTERM) never closes them


@events.quit.add_listener
def _close_senders(**_) -> None:
    """After the users have stopped, before Locust exits: a gRPC channel left to the interpreter's exit can block
    it for good (loadtest/locust_suite/user.py says how)."""
    while OPEN_SENDERS:
        try:
            OPEN_SENDERS.pop().close()
        except Exception:  # closing is all that is left to do
            pass


def _status(err: Exception) -> str:
    status = getattr(err, "status", None)
    found = status() if callable(status) else None
    if found is None and hasattr(err, "code"):
        found = err.code()
    return str(found or type(err).__name__)


class ReplayUser(User):
    """Walks the schedule once, open loop; quits the run when every answer is in."""

    fixed_count = 1
    wait_time = constant(0)

    def on_start(self):
        self.items = read_schedule(SCHEDULE)
        self.senders, self.results, self.done = Senders(), [], 0
        OPEN_SENDERS.append(self.senders)
        self.greenlets = []

    @task
    def replay(self):
        started = time.perf_counter()
        progress = gevent.spawn(self._progress, started)
        behind = dispatch(self.items, self._send, time.perf_counter, gevent.sleep, self._spawn)
        gevent.joinall(self.greenlets)
        progress.kill()
        self._write(behind)
        self.senders.close()
        print(f"replay: {len(self.items)} requests sent, at most {behind * 1000:.0f} ms behind schedule", flush=True)
        gevent.spawn(self.environment.runner.quit)  # not from this greenlet: quitting stops it first
        raise StopUser

    def _spawn(self, send, item):
        self.greenlets.append(gevent.spawn(send, item))

    def _send(self, item):
        sent = time.perf_counter()
        error, status = None, "ok"
        try:
            status = self.senders.send(item)
            if status != "ok":
                error = RuntimeError(status)
        except RecordingError as err:
            status, error = "not sent", err
        except Exception as err:  # reported as a failure, never raised into gevent
            status, error = _status(err), err
        ms = (time.perf_counter() - sent) * 1000
        self.results.append((sent, item, status, ms))
        self.done += 1
        events.request.fire(
            request_type=item.protocol.upper(),
            name=item.model,
            response_time=ms,
            response_length=0,
            exception=None if error is None else RequestFailed.of(error),
            context={},
        )

    def _progress(self, started: float):
        while True:
            gevent.sleep(10)
            elapsed = time.perf_counter() - started
            print(f"replay: {elapsed:.0f} s, {self.done}/{len(self.items)} answered", file=sys.stderr, flush=True)

    def _write(self, behind: float) -> None:
        start = self.results[0][0] if self.results else 0.0
        first = min((sent for sent, *_ in self.results), default=start)
        with open(RESULTS, "w") as handle:
            handle.write(json.dumps({"behind_s": behind}) + "\n")
            for sent, item, status, ms in sorted(self.results, key=lambda r: r[0]):
                line = {
                    "sent_s": round(sent - first, 6),
                    "model": item.model,
                    "protocol": item.protocol,
                    "status": status,
                    "ms": round(ms, 3),
                    "scheduled_s": item.offset_s,
                }
                handle.write(json.dumps(line) + "\n")
