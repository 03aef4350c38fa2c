"""An open-loop replay fast enough for a GPU (`GENERATOR=fast`): every request serialized once ahead of time, then
sent at its offset by worker processes (asyncio), whatever the earlier ones are doing.

Locust's replay (locust_suite/replay.py) builds each request through tritonclient in one process; on an H200 host
it fell 145 ms behind its schedule at 400 requests/s. Here a request costs the client what the closed-loop
client's does (ragged_load: its payloads, its answer reading). The schedule is dealt round robin over the
processes, which start together: each opens its connections and says it is ready, then all begin at one
wall-clock instant. HTTP: a keep-alive connection per request in flight, up to `connections` a process (a request
waiting for one is timed from when it was due); gRPC: one channel a process. What comes back has the Locust
replay's form (locust_suite/replay.read_results), so reports and plans read either, plus how busy the busiest
process was: one busy nearly all along may have set the pace itself.
"""

from __future__ import annotations

import base64
import json
import math
import multiprocessing
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError, RecordingError
from tpserve.loadtest.workloads import ragged_load
from tpserve.loadtest.workloads.recorded import ReplayItem, synthetic_inputs

PER_PROCESS_RATE = 1500.0  # requests/s a process is given at most (gRPC's cost a request: about 0.3 ms of CPU)
NOT_SENT = -1  # a payload that could not be made (a BYTES input recorded without values)
PROGRESS_S = 10.0


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where and how to send: the server's addresses, TLS, headers sent with every request."""

    http_url: str
    grpc_url: str
    headers: dict = field(default_factory=dict)
    tls: bool = False
    ca_file: str = ""
    connections: int = 64  # HTTP connections a process at most


def processes_for(items: list[ReplayItem], cores: int | None = None) -> int:
    """Enough processes that none is given more than PER_PROCESS_RATE, within half this host's cores."""
    span = max(items[-1].offset_s, 1.0) if items else 1.0
    rate = (len(items) - 1) / span  # the intervals between sends
    most = max(1, (cores or multiprocessing.cpu_count() or 2) // 2)
    return max(1, min(most, math.ceil(rate / PER_PROCESS_RATE - 1e-6)))


def payloads(items: list[ReplayItem], repo: Path | None, target: Target) -> tuple[list[bytes], list[int]]:
    """Each distinct request serialized once (a recorded body as recorded; made-up inputs of the recorded shapes
    as the Locust replay makes them), and each item's index into that table (NOT_SENT: it cannot be made)."""
    from tpserve.clients.served import served_spec

    table: list[bytes] = []
    index_of: dict[tuple, int] = {}
    chosen = []
    for item in items:
        body = (item.values or {}).get("body")
        key = (item.protocol, item.model, item.version, body or item.inputs, (item.values or {}).get("header_length"))
        if key not in index_of:
            try:
                table.append(_payload(item, body, served_spec(repo, item.model), target))
                index_of[key] = len(table) - 1
            except RecordingError:
                index_of[key] = NOT_SENT
        chosen.append(index_of[key])
    return table, chosen


def _payload(item: ReplayItem, body: str | None, spec, target: Target) -> bytes:
    if body:
        raw = base64.b64decode(body)
        if item.protocol == "grpc":
            return raw
        length = int((item.values or {}).get("header_length") or 0)
        path = ragged_load.infer_path(item.model, item.version)
        return ragged_load.http_post(path, raw, length, target.http_url, target.headers)
    arrays = synthetic_inputs(item, spec)
    if item.protocol == "grpc":
        return ragged_load.serialize(item.model, [arrays], [], item.version)[0]
    return ragged_load.serialize_http(item.model, [arrays], [], target.http_url, target.headers, item.version)[0]


def run_open_loop(items: list[ReplayItem], repo: Path | None, target: Target, out: Path, processes: int = 0) -> dict:
    """Replay the schedule open loop over worker processes (0: processes_for); write and return the results as
    locust_suite/replay.read_results does, with 'client_busy' and 'processes'.

    Raises:
        MeasurementError: a worker process died or the replay ran far past its schedule.
    """
    table, chosen = payloads(items, repo, target)
    processes = processes or processes_for(items)
    dealt = [
        [(items[i].offset_s, items[i].protocol, chosen[i], i) for i in range(k, len(items), processes)]
        for k in range(processes)
    ]
    found = _run_workers([_own_table(s, table) for s in dealt if s], target, timeout=items[-1].offset_s + 300)
    results = _merged(found, items)
    _write(results, out / "replay_results.jsonl")
    return results


def _own_table(share: list[tuple], table: list[bytes]) -> tuple[list[tuple], list[bytes]]:
    """A share with only the payloads it sends (recorded bodies can each be distinct: no process gets them all)."""
    local: dict[int, int] = {}
    for _, _, payload, _ in share:
        if payload != NOT_SENT and payload not in local:
            local[payload] = len(local)
    renumbered = [(o, p, local.get(payload, NOT_SENT), i) for o, p, payload, i in share]
    return renumbered, [table[index] for index in local]


def _run_workers(shares: list[tuple[list[tuple], list[bytes]]], target: Target, timeout: float) -> list:
    ctx = multiprocessing.get_context("spawn")
    ready, answers, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    start_at, answered = ctx.Value("d", 0.0), ctx.Array("q", len(shares), lock=False)
    workers = [
        ctx.Process(target=_worker, args=(k, share, table, target, ready, go, start_at, answered, answers), daemon=True)
        for k, (share, table) in enumerate(shares)
    ]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            _await(ready, workers, 120.0, "open its connections")
        start_at.value = time.time() + 0.05
        go.set()
        total, begun = sum(len(s) for s, _ in shares), time.monotonic()
        found: list = []
        shown = begun
        while len(found) < len(workers):
            found += _drain(answers)
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                step(f"replay: {shown - begun:.0f} s, {sum(answered)}/{total} answered")
            if time.monotonic() - begun > timeout:
                raise MeasurementError(f"the replay ran {timeout:.0f} s, far past its schedule; stopped")
            if len(found) < len(workers) and any(w.exitcode not in (None, 0) for w in workers):
                raise MeasurementError("a replay process died (its error is above)")
            time.sleep(0.05)
        return found
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()


def _await(queue, workers, seconds: float, what: str):
    import queue as queues

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=0.2)
        except queues.Empty:
            if any(w.exitcode not in (None, 0) for w in workers):
                raise MeasurementError(f"a replay process died before it could {what} (its error is above)") from None
    raise MeasurementError(f"a replay process did not {what} within {seconds:.0f} s")


def _drain(queue) -> list:
    import queue as queues

    got = []
    while True:
        try:
            got.append(queue.get_nowait())
        except queues.Empty:
            return got


def _merged(found: list, items: list[ReplayItem]) -> dict:
    sent = []
    for _, _, _, answers in found:
        for index, sent_s, status, ms in answers:
            item = items[index]
            sent.append(
                {
                    "sent_s": round(sent_s, 6),
                    "model": item.model,
                    "protocol": item.protocol,
                    "status": status,
                    "ms": round(ms, 3),
                    "scheduled_s": item.offset_s,
                }
            )
    sent.sort(key=lambda s: s["sent_s"])
    return {
        "behind_s": max(f[1] for f in found),
        "client_busy": round(max(f[2] for f in found), 3),
        "processes": len(found),
        "sent": sent,
    }


def _write(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {k: results[k] for k in ("behind_s", "client_busy", "processes")}
    with open(path, "w") as handle:
        handle.write(json.dumps(head) + "\n")
        for line in results["sent"]:
            handle.write(json.dumps(line) + "\n")


def _worker(slot, share, table, target, ready, go, start_at, answered, answers) -> None:
    import asyncio

    answers.put(asyncio.run(_walk(slot, share, table, target, ready, go, start_at, answered)))


async def _walk(slot, share, table, target: Target, ready, go, start_at, answered):
    """This process's share, open loop from the common start; (slot, worst lateness, CPU busy, answers)."""
    import asyncio

    senders = await _senders(target, {protocol for _, protocol, _, _ in share})
    ready.put(slot)
    go.wait(300)
    start = time.perf_counter() + (start_at.value - time.time())
    cpu, wall = time.process_time(), time.perf_counter()
    answers: list = []
    pending: set = set()
    behind = 0.0

    async def one(index: int, protocol: str, payload: int) -> None:
        sent = time.perf_counter()
        status = "not sent" if payload == NOT_SENT else await senders[protocol].send(table[payload])
        answers.append((index, sent - start, status, (time.perf_counter() - sent) * 1000))
        answered[slot] += 1

    for n, (offset, protocol, payload, index) in enumerate(share):
        wait = start + offset - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        elif n % 32 == 0:
            await asyncio.sleep(0)  # overdue: let the sends already made go out
        behind = max(behind, time.perf_counter() - start - offset)
        task = asyncio.ensure_future(one(index, protocol, payload))
        pending.add(task)
        task.add_done_callback(pending.discard)
    while pending:
        await asyncio.gather(*list(pending))
    busy = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
    for sender in senders.values():
        await sender.close()
    return slot, behind, busy, answers


async def _senders(target: Target, protocols: set[str]) -> dict:
    made: dict = {}
    if "http" in protocols:
        made["http"] = HttpSender(target)
        await made["http"].warm()
    if "grpc" in protocols:
        made["grpc"] = GrpcSender(target)
        await made["grpc"].warm()
    return made


class HttpSender:
    """Keep-alive HTTP/1.1 connections: an idle one reused, a new one opened while fewer than `connections` are
    open, else the request waits for one."""

    def __init__(self, target: Target):
        import asyncio

        self.host, _, port = target.http_url.rpartition(":")
        self.port = int(port)
        self.idle: list = []
        self.ssl = _ssl_context(target) if target.tls else None
        self.slots = asyncio.Semaphore(max(1, target.connections))

    async def warm(self) -> None:
        """One connection opened ahead (a server that cannot be reached fails every request, said per request)."""
        try:
            self.idle.append(await self._connect())
        except OSError:
            pass

    async def _connect(self):
        import asyncio

        return await asyncio.open_connection(self.host, self.port, ssl=self.ssl)

    async def send(self, payload: bytes) -> str:
        import asyncio
        import ssl

        async with self.slots:
            connection = None
            try:
                connection = self.idle.pop() if self.idle else await self._connect()
                connection[1].write(payload)
                status, _, closing = await ragged_load.read_answer_closing(connection[0])
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ssl.SSLError) as err:
                if connection is not None:
                    connection[1].close()
                return f"{type(err).__name__}: {err}"
            if closing:  # the server closes it after this answer: never sent on again
                connection[1].close()
            else:
                self.idle.append(connection)
            return "ok" if status == 200 else f"http {status}"

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle = []


class GrpcSender:
    """One grpc.aio channel; bytes in, bytes out."""

    def __init__(self, target: Target):
        import grpc

        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        if target.tls:
            roots = Path(target.ca_file).read_bytes() if target.ca_file else None
            self.channel = grpc.aio.secure_channel(target.grpc_url, grpc.ssl_channel_credentials(roots), options)
        else:
            self.channel = grpc.aio.insecure_channel(target.grpc_url, options=options)
        self.infer = self.channel.unary_unary(ragged_load.INFER_METHOD)
        self.metadata = tuple((k.lower(), v) for k, v in target.headers.items()) or None

    async def warm(self) -> None:
        import asyncio

        try:
            await asyncio.wait_for(self.channel.channel_ready(), 3)
        except asyncio.TimeoutError:
            pass

    async def send(self, payload: bytes) -> str:
        import grpc

        try:
            await self.infer(payload, metadata=self.metadata, timeout=120)
        except grpc.aio.AioRpcError as err:
            return f"grpc {err.code().name}"
        return "ok"

    async def close(self) -> None:
        await self.channel.close()


def _ssl_context(target: Target):
    import ssl

    return ssl.create_default_context(cafile=target.ca_file or None)
