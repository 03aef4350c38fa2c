"""Closed-loop gRPC load from requests serialized once: what perf_analyzer cannot send.

perf_analyzer builds a request of batch b from b consecutive entries of its input data and requires them to
share one shape, so it cannot send requests of several sentences whose padded width changes from request to
request (a client batching 32 sentences pads them to their own longest). Here every request is a
ModelInferRequest serialized ahead of time; worker processes keep `concurrency` requests in flight over
grpc.aio, cycling through them, and time each one. The client's own cost per request is one send of bytes
already made, so the server, not the client, sets the pace (the bench measures the same model with
perf_analyzer where both can, to show it).
"""

from __future__ import annotations

import multiprocessing
import struct
import time
from dataclasses import dataclass

import numpy as np

from common.errors import MeasurementError

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
CLIENT_BOUND = 0.9  # a client process this busy (cores) may set the pace itself


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


def serialize(model: str, requests: list[dict], outputs: list[str]) -> list[bytes]:
    """Each request (input name -> array [rows, ...]) as ModelInferRequest bytes."""
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import np_to_triton_dtype

    made = []
    for arrays in requests:
        message = service_pb2.ModelInferRequest(model_name=model)
        for name, array in arrays.items():
            tensor = message.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype))
            tensor.shape.extend(array.shape)
            message.raw_input_contents.append(_raw(array))
        for name in outputs:
            message.outputs.add(name=name)
        made.append(message.SerializeToString())
    return made


def _raw(array: np.ndarray) -> bytes:
    """A tensor's raw contents as Triton reads them (BYTES: each element's uint32 length, then its bytes)."""
    if array.dtype == object:
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    return np.ascontiguousarray(array).tobytes()


def _worker(url, payloads, rows, concurrency, warmup_s, seconds, headers, queue, cores=None) -> None:
    import asyncio
    import os

    if cores:
        os.sched_setaffinity(0, cores)
    queue.put(asyncio.run(_closed_loop(url, payloads, rows, concurrency, warmup_s, seconds, headers)))


async def _closed_loop(url, payloads, rows, concurrency, warmup_s, seconds, headers):
    import asyncio

    import grpc

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(url, options=options) as channel:
        infer = channel.unary_unary(INFER_METHOD)  # bytes in, bytes out: nothing serialized per request
        metadata = tuple(headers.items()) or None
        start, cpu = time.perf_counter(), time.process_time()
        begin, end = start + warmup_s, start + warmup_s + seconds
        state = {"next": 0, "latencies": [], "rows": 0, "errors": 0, "first_error": ""}

        async def one_user(offset):
            index = offset
            while time.perf_counter() < end:
                sent = time.perf_counter()
                try:
                    await infer(payloads[index % len(payloads)], metadata=metadata)
                    ok = True
                except grpc.aio.AioRpcError as err:
                    ok = False
                    state["first_error"] = state["first_error"] or f"{err.code().name}: {err.details()}"
                done = time.perf_counter()
                if begin <= sent and done <= end:
                    if ok:
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
) -> LoadResult:
    """`concurrency` requests in flight (spread over worker processes) for `seconds` after a warm-up; cores: the
    workers run on those alone (one process a core, up to 8). Each process measures its own CPU time: a process
    busy nearly all along (client_bound) may have set the pace, not the server.

    Raises:
        MeasurementError: no request succeeded (the first error says why).
    """
    available = len(cores) if cores else (multiprocessing.cpu_count() or 2) // 2
    processes = processes or max(1, min(8, concurrency // 16 or 1, available))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    workers = [
        ctx.Process(
            target=_worker,
            args=(
                url,
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
