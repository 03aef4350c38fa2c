"""Where a Triton is and how to reach it: the server-state record our launcher leaves, the endpoint record
clients use, the admin headers, the default ports, and free ports for tests and benchmarks."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import KW_ONLY, asdict, dataclass, field
from pathlib import Path

from tpserve.common.errors import ClientError, ServerError

ADMIN_HEADER = "admin-key"
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"  # how gRPC clients send a restricted protocol's key
GRPC_ADMIN_HEADER = f"{GRPC_RESTRICTED_PREFIX}{ADMIN_HEADER}"
PROTOCOLS = ("http", "grpc")
PROTOCOL_NAMES = {"grpc": "gRPC", "http": "HTTP"}  # as reports name them
STATE = "server.json"  # a running server's record in its state folder
STATE_DIR = Path(".triton")  # the default state folder
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002  # Triton's defaults, ours too
HEALTH_PORT = 8003  # the supervisor's readiness port


@dataclass(frozen=True)
class Endpoint:
    """A server address for one protocol, with the admin headers if the key is known."""

    protocol: str
    url: str
    admin_headers: dict = field(default_factory=dict)
    repo: Path | None = None
    _: KW_ONLY
    headers: dict = field(default_factory=dict)  # sent with every request (a gateway's auth, say)
    tls: bool = False  # HTTPS / gRPC over TLS
    ca_file: str | None = None  # PEM roots that sign the server's certificate (default: the system's)

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ClientError(f"protocol {self.protocol!r} is unknown; expected one of {PROTOCOLS}")

    def request_headers(self) -> dict | None:
        """The headers for one call, a copy (None: none): tritonclient.http writes its Inference-Header-Content-Length,
        an int, into the dict it is given, and the same dict sent over gRPC then fails ("Expected str")."""
        return dict(self.headers) or None

    def client(self, **kwargs):
        """A new tritonclient client (tritonclient.http or tritonclient.grpc) for this endpoint."""
        if self.tls and self.protocol == "http":
            kwargs.update(ssl=True, ssl_options={"ca_certs": self.ca_file} if self.ca_file else None)
        elif self.tls:
            kwargs.update(ssl=True, root_certificates=self.ca_file)
        return self.module().InferenceServerClient(self.url, **kwargs)

    def module(self):
        """The tritonclient module of this protocol."""
        if self.protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        return module


@dataclass(frozen=True, kw_only=True)
class ServerState:
    """What a running server left in its state folder, for our clients and `make stop`."""

    pid: int
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    repo: str
    log: str
    admin_key_file: str
    left_out: dict[str, str] = field(default_factory=dict)  # models of the repository not served here, and why

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def admin_headers(self, protocol: str = "http") -> dict:
        """Headers (HTTP) or metadata (gRPC) that unlock the restricted admin APIs."""
        key = Path(self.admin_key_file).read_text().strip()
        return {ADMIN_HEADER if protocol == "http" else GRPC_ADMIN_HEADER: key}

    def endpoint(self, protocol: str = "http", repo: Path | None = None) -> Endpoint:
        """This server over one protocol, with its admin key (repo: the repository to name, if any)."""
        url = self.http_url if protocol == "http" else self.grpc_url
        return Endpoint(protocol, url, self.admin_headers(protocol), repo)


def read_state(state_dir: Path) -> ServerState:
    """The state of the server started from state_dir.

    Raises:
        ServerError: no server was started from there.
    """
    path = state_dir / STATE
    if not path.exists():
        raise ServerError(f"no server state in {state_dir}: start one with `make serve`")
    return ServerState(**json.loads(path.read_text()))


def write_state(state_dir: Path, state: ServerState) -> None:
    """Leave state in state_dir for read_state (our clients, `make stop`): written whole, then renamed into
    place, so that a reader never sees a half-written record (a supervisor rewrites it on every restart)."""
    partial = state_dir / f".{STATE}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(asdict(state), indent=2))
    os.replace(partial, state_dir / STATE)


def free_ports(count: int, avoid=()) -> list[int]:
    """count distinct TCP ports on 127.0.0.1 that nothing holds right now, none of them in avoid (ports already
    promised to something not yet listening: a start's own metrics or health port, say)."""
    sockets: list[socket.socket] = []
    try:
        while len([s for s in sockets if s.getsockname()[1] not in avoid]) < count:
            sock = socket.socket()
            sockets.append(sock)  # held while more are taken, so that none comes twice
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets if s.getsockname()[1] not in avoid][:count]
    finally:
        for sock in sockets:
            sock.close()
