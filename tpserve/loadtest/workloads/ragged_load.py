"""Closed-loop load from requests serialized once, over gRPC or HTTP: what perf_analyzer cannot send.

perf_analyzer builds a request of batch b from b consecutive entries of its input data and requires them to
share one shape, so it cannot send requests of several sentences whose padded width changes from request to
request (a client batching 32 sentences pads them to their own longest). Here every request is serialized ahead
of time (a ModelInferRequest for gRPC; for HTTP the whole HTTP/1.1 message, a JSON header and the tensors in
Triton's binary extension); worker processes keep `concurrency` requests in flight, cycling through them, and
time each one. gRPC goes through grpc.aio; HTTP through asyncio streams, one keep-alive connection a user, which
costs the client about a third of gRPC's CPU a request (measured: 88-100 against 282-352 µs on a 2-core host), so
a client of a few processes can keep a fast server busy. Each process measures its own CPU time: a run says when
the client may have set the pace.
"""

from __future__ import annotations

import json
import multiprocessing
import struct
import time
from dataclasses import dataclass

import numpy as np

from tpserve.common.endpoints import PROTOCOLS
from tpserve.common.errors import MeasurementError

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
CLIENT_BOUND = 0.9  # a client process this busy (cores) may set the pace itself
RECONNECT_S = 0.01  # HTTP: a user whose connection failed opens another this much later
MAX_PROCESSES = 16  # at c256 on a 16-core H200 host, 16 gRPC processes served single sentences 1.09x what 8 did


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    """What one closed-loop run measured."""

    requests: int
    rows: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    first_error: str = ""
    processes: int = 1
    client_busy: float = 0.0  # the busiest client process's CPU time over its run, in cores (1.0: one core, all along)

    @property
    def client_bound(self) -> bool:
        """A client process was busy nearly all along: the figure may be the client's, not the server's."""
        return self.client_busy >= CLIENT_BOUND

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def serialize(model: str, requests: list[dict], outputs: list[str], version: str = "") -> list[bytes]:
    """Each request (input name -> array [rows, ...]) as ModelInferRequest bytes (to one version if given)."""
    from tritonclient.grpc import service_pb2

    made = []
    for arrays in requests:
        message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
        for name, array in arrays.items():
            tensor = message.inputs.add(name=name, datatype=_datatype(array))
            tensor.shape.extend(array.shape)
            message.raw_input_contents.append(_raw(array))
        for name in outputs:
            message.outputs.add(name=name)
        made.append(message.SerializeToString())
    return made


def serialize_http(
    model: str, requests: list[dict], outputs: list[str], url: str, headers: dict | None = None, version: str = ""
) -> list[bytes]:
    """Each request (input name -> array [rows, ...]) as a whole HTTP/1.1 POST to Triton's infer URL: a JSON
    header, then every input's raw contents (Triton's binary tensor extension), outputs asked for as binary (no
    outputs named: every one, binary); headers: sent with each (a gateway's, say); version: to that one."""
    made = []
    for arrays in requests:
        raws = [_raw(array) for array in arrays.values()]
        header: dict = {
            "inputs": [
                {
                    "name": name,
                    "shape": list(array.shape),
                    "datatype": _datatype(array),
                    "parameters": {"binary_data_size": len(raw)},
                }
                for (name, array), raw in zip(arrays.items(), raws)
            ],
        }
        if outputs:
            header["outputs"] = [{"name": name, "parameters": {"binary_data": True}} for name in outputs]
        else:
            header["parameters"] = {"binary_data_output": True}
        head = json.dumps(header, separators=(",", ":")).encode()
        made.append(http_post(infer_path(model, version), head + b"".join(raws), len(head), url, headers))
    return made


def infer_path(model: str, version: str = "") -> str:
    return f"/v2/models/{model}{f'/versions/{version}' if version else ''}/infer"


def http_post(path: str, body: bytes, header_length: int, url: str, headers: dict | None = None) -> bytes:
    """A whole HTTP/1.1 POST of body to path on url (host:port); header_length: the JSON header's length where
    binary tensors follow it (0: the body is all JSON)."""
    kind = "application/octet-stream" if header_length else "application/json"
    lines = [f"POST {path} HTTP/1.1", f"Host: {url}", f"Content-Type: {kind}"]
    if header_length:
        lines.append(f"Inference-Header-Content-Length: {header_length}")
    lines += [f"Content-Length: {len(body)}", *(f"{name}: {value}" for name, value in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _datatype(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(array.dtype)


def _raw(array: np.ndarray) -> bytes:
    """A tensor's raw contents as Triton reads them (BYTES: each element's uint32 length, then its bytes)."""
    if array.dtype == object:
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    return np.ascontiguousarray(array).tobytes()


def _worker(url, protocol, payloads, rows, concurrency, warmup_s, seconds, headers, queue, cores=None) -> None:
    import asyncio
    import os

    if cores:
        os.sched_setaffinity(0, cores)
    loop = _grpc_loop if protocol == "grpc" else _http_loop
    queue.put(asyncio.run(loop(url, payloads, rows, concurrency, warmup_s, seconds, headers)))


async def _grpc_loop(url, payloads, rows, concurrency, warmup_s, seconds, headers):
    import grpc

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(url, options=options) as channel:
        infer = channel.unary_unary(INFER_METHOD)  # bytes in, bytes out: nothing serialized per request
        metadata = tuple(headers.items()) or None

        async def send(user: int, payload: bytes) -> str:
            try:
                await infer(payload, metadata=metadata)
            except grpc.aio.AioRpcError as err:
                return f"{err.code().name}: {err.details()}"
            return ""

        return await _closed_loop(send, payloads, rows, concurrency, warmup_s, seconds)


async def _http_loop(
    url: str, payloads: list[bytes], rows: list[int], concurrency: int, warmup_s: float, seconds: float, headers: dict
):
    """One keep-alive connection a user, opened again after an error (a moment later: a server that refuses
    connections is not spun on); the answer read by its Content-Length. headers: already in the payloads."""
    import asyncio

    host, port = url.rsplit(":", 1)
    connections: dict[int, tuple] = {}

    async def send(user: int, payload: bytes) -> str:
        try:
            if user not in connections:
                connections[user] = await asyncio.open_connection(host, int(port))
            reader, writer = connections[user]
            writer.write(payload)
            status, body = await read_answer(reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
            _close(connections.pop(user, None))
            await asyncio.sleep(RECONNECT_S)
            return f"{type(err).__name__}: {err}"
        return "" if status == 200 else f"HTTP {status}: {_error_text(body)}"

    try:
        return await _closed_loop(send, payloads, rows, concurrency, warmup_s, seconds)
    finally:
        for connection in connections.values():
            _close(connection)


async def read_answer(reader) -> tuple[int, bytes]:
    """An HTTP/1.1 answer's status and body (the body by its Content-Length).

    Raises:
        ValueError: not an HTTP/1.1 answer this client reads (no status, no Content-Length, chunked).
    """
    status, body, _ = await read_answer_closing(reader)
    return status, body


async def read_answer_closing(reader) -> tuple[int, bytes, bool]:
    """read_answer's status and body, and whether the server closes the connection after it (Connection: close):
    a connection to reuse only where it does not."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    if b"chunked" in fields.get(b"transfer-encoding", b"").lower() or not fields.get(b"content-length", b"").isdigit():
        raise ValueError("an answer without a Content-Length")
    closing = fields.get(b"connection", b"").lower() == b"close"
    return int(parts[1]), await reader.readexactly(int(fields[b"content-length"])), closing


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


def _close(connection) -> None:
    if connection is not None:
        connection[1].close()


async def _closed_loop(send, payloads, rows, concurrency, warmup_s, seconds):
    """`concurrency` users, each sending its next request as its last is answered; times those sent and answered
    inside the window. send(user, payload) returns "" or what went wrong."""
    import asyncio

    start, cpu = time.perf_counter(), time.process_time()
    begin, end = start + warmup_s, start + warmup_s + seconds
    state = {"latencies": [], "rows": 0, "errors": 0, "first_error": ""}

    async def one_user(user):
        index = user
        while time.perf_counter() < end:
            sent = time.perf_counter()
            error = await send(user, payloads[index % len(payloads)])
            done = time.perf_counter()
            state["first_error"] = state["first_error"] or error
            if begin <= sent and done <= end:
                if not error:
                    state["latencies"].append(done - sent)
                    state["rows"] += rows[index % len(payloads)]
                else:
                    state["errors"] += 1
            index += concurrency

    await asyncio.gather(*(one_user(i) for i in range(concurrency)))
    busy = (time.process_time() - cpu) / max(time.perf_counter() - start, 1e-9)
    return state["latencies"], state["rows"], state["errors"], state["first_error"], busy


def run(
    url: str,
    payloads: list[bytes],
    rows: list[int],
    concurrency: int,
    seconds: float = 5.0,
    processes: int = 0,
    warmup_s: float = 1.0,
    headers: dict | None = None,
    cores: set[int] | None = None,
    protocol: str = "grpc",
) -> LoadResult:
    """`concurrency` requests in flight (spread over worker processes, 16 users or more each, one process a core
    at most, up to 16) for `seconds` after a warm-up; cores: the workers run on those alone. payloads: made by
    serialize (grpc) or serialize_http (http, with this url); headers: gRPC metadata (HTTP: in the payloads).
    Each process measures its own CPU time: a process busy nearly all along (client_bound) may have set the pace.

    Raises:
        MeasurementError: no request succeeded (the first error says why).
    """
    if protocol not in PROTOCOLS:
        raise MeasurementError(f"protocol {protocol!r}: the closed-loop client speaks grpc or http")
    available = len(cores) if cores else (multiprocessing.cpu_count() or 2)
    processes = processes or max(1, min(MAX_PROCESSES, concurrency // 16 or 1, available))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    workers = [
        ctx.Process(
            target=_worker,
            args=(
                url,
                protocol,
                payloads[i::processes] or payloads,
                rows[i::processes] or rows,
                share,
                warmup_s,
                seconds,
                headers or {},
                queue,
                cores,
            ),
            daemon=True,
        )
        for i, share in enumerate(shares)
        if share
    ]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=seconds + warmup_s + 120) for _ in workers]
    for worker in workers:
        worker.join(timeout=10)
    latencies = np.array([x for r in results for x in r[0]]) * 1e3
    errors, first = sum(r[2] for r in results), next((r[3] for r in results if r[3]), "")
    if not len(latencies):
        raise MeasurementError(f"no request succeeded at {url} ({errors} failed): {first or 'no answer in time'}")
    return LoadResult(
        requests=len(latencies),
        rows=sum(r[1] for r in results),
        seconds=seconds,
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        errors=errors,
        first_error=first,
        processes=len(results),
        client_busy=max(r[4] for r in results),
    )
