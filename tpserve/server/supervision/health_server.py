"""The supervisor's readiness endpoint: truthful under slow and many clients.

A thread-per-connection server with a per-read timeout let 32 sockets, each sending a byte every 3 s, hold
every slot: readiness stopped answering, Envoy marked the replica unhealthy and refused every request.
Here one asyncio loop serves every connection, and:
- a connection must deliver its whole request (line and headers, at most MAX_REQUEST_BYTES) within
  REQUEST_TIMEOUT_S, however it trickles in, or it is closed;
- at most MAX_CONNECTIONS are open at once; one more closes the oldest, so a flood of idle sockets cannot
  keep a new client out;
- the same answers are served on a Unix socket of mode 0600 in the state folder: Envoy health-checks that
  one, which no other local user can reach or fill.
Every answer is one HTTP/1.1 response, then the connection closes.
Readiness (and /metrics, as tritonserver's own metrics port) is anyone's; every other path (/status: pids, restart
causes, log tails) is answered on the TCP port only to a request carrying the admin key (header `admin-key`), and
on the private Unix socket to its owner.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

MAX_CONNECTIONS = 256
REQUEST_TIMEOUT_S = 2.0
MAX_REQUEST_BYTES = 8192
REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           503: "Service Unavailable"}  # fmt: skip
PUBLIC = ("/v2/health/ready", "/ready", "/v2/health/live", "/metrics")  # and /v2/models/<m>/ready
KEY_HEADER = b"admin-key"

Answer = Callable[[str], tuple[int, dict | str]]  # path -> (status, JSON body, or text: Prometheus' /metrics)


class HealthServer:
    """Serves answer(path) for GET requests on host:port and, if given, on a private Unix socket."""

    def __init__(
        self, host: str, port: int, answer: Answer, socket_path: Path | None = None, key_file: Path | None = None
    ):
        self.host, self.port, self.answer, self.socket_path = host, port, answer, socket_path
        self.key_file = key_file  # None: every path is anyone's (a supervisor of no keyed server)
        self.loop = asyncio.new_event_loop()
        self.open: OrderedDict[asyncio.StreamWriter, None] = OrderedDict()
        self.started = threading.Event()
        self.failure: BaseException | None = None
        self.servers: list[asyncio.AbstractServer] = []

    def start(self) -> None:
        """Bind both listeners and serve on a daemon thread; raise if a listener cannot bind."""
        threading.Thread(target=self._run, name="health-server", daemon=True).start()
        self.started.wait()
        if self.failure:
            raise self.failure

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._listen())
        except BaseException as err:  # reported to start()'s caller
            self.failure = err
            self.started.set()
            return
        self.started.set()
        self.loop.run_forever()

    async def _listen(self) -> None:
        public = await asyncio.start_server(self._serve_public, self.host, self.port, limit=MAX_REQUEST_BYTES)
        self.servers.append(public)
        if self.socket_path:
            self.socket_path.unlink(missing_ok=True)
            old = os.umask(0o177)
            try:
                server = await asyncio.start_unix_server(
                    self._serve_owner, str(self.socket_path), limit=MAX_REQUEST_BYTES
                )
            finally:
                os.umask(old)
            os.chmod(self.socket_path, 0o600)
            self.servers.append(server)

    async def _serve_public(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, owner=False)

    async def _serve_owner(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, owner=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, owner: bool) -> None:
        self.open[writer] = None
        while len(self.open) > MAX_CONNECTIONS:
            oldest = next(iter(self.open))
            self.open.pop(oldest)
            oldest.transport.abort()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            status, body = self._respond(head, owner)
            writer.write(_response(status, body))
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            self.open.pop(writer, None)
            writer.close()

    def _respond(self, head: bytes, owner: bool) -> tuple[int, dict | str]:
        line, _, fields = head.partition(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return 400, {"error": "not an HTTP/1.x request line"}
        if parts[0] != b"GET":
            return 405, {"error": "only GET is served here"}
        try:
            path = parts[1].decode("ascii")
        except UnicodeDecodeError:
            return 400, {"error": "the path is not ASCII"}
        if not (owner or _public(path) or self._keyed(fields)):
            return 403, {"error": f"{path[:100]} needs the admin key (header 'admin-key'); readiness is anyone's"}
        return self.answer(path)

    def _keyed(self, fields: bytes) -> bool:
        """Whether the request's headers carry the admin key (exactly one admin-key field, the key)."""
        if self.key_file is None:
            return True
        try:
            key = self.key_file.read_bytes().strip()
        except OSError:
            return False
        given = [
            v.strip()
            for k, _, v in (f.partition(b":") for f in fields.split(b"\r\n"))
            if k.strip().lower() == KEY_HEADER
        ]
        return len(given) == 1 and bool(key) and hmac.compare_digest(given[0], key)

    def shutdown(self) -> None:
        """Close the listeners and every connection, then stop the loop."""

        async def close() -> None:
            for server in self.servers:
                server.close()
            for writer in list(self.open):
                writer.transport.abort()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=5)
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self.socket_path:
            self.socket_path.unlink(missing_ok=True)


def _public(path: str) -> bool:
    parts = path.strip("/").split("/")
    return path in PUBLIC or (len(parts) == 4 and parts[:2] == ["v2", "models"] and parts[3] == "ready")


def _response(status: int, body: dict | str) -> bytes:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    kind = "text/plain; version=0.0.4" if isinstance(body, str) else "application/json"
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data
