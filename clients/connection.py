"""Where the server is and how to talk to it, over HTTP or gRPC."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from builders.errors import ClientError, ServerError

PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True)
class Endpoint:
    """A server address for one protocol, with the admin headers if the key is known."""

    protocol: str
    url: str
    admin_headers: dict = field(default_factory=dict)
    repo: Path | None = None

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ClientError(f"protocol {self.protocol!r} is unknown; expected one of {PROTOCOLS}")

    def client(self, **kwargs):
        """A new tritonclient client (tritonclient.http or tritonclient.grpc) for this endpoint."""
        return self.module().InferenceServerClient(self.url, **kwargs)

    def module(self):
        """The tritonclient module of this protocol."""
        if self.protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        return module


@contextlib.contextmanager
def refused_as_client_error(what: str):
    """Turn tritonclient's InferenceServerException into a ClientError naming what was asked."""
    from tritonclient.utils import InferenceServerException

    try:
        yield
    except InferenceServerException as err:
        raise ClientError(f"{what}: server refused the request ({err.status()}): {err.message()}") from err


def endpoint(protocol: str = "http", url: str | None = None, state_dir: Path = Path(".triton")) -> Endpoint:
    """The endpoint of the server started from state_dir, or of url if given (no admin key then)."""
    from server.launcher import read_state

    try:
        state = read_state(state_dir)
    except ServerError:
        if url is None:
            raise ClientError(
                f"no server known: none was started from {state_dir} and no --url was given; "
                "run `make serve` or pass --url HOST:PORT"
            ) from None
        return Endpoint(protocol, url)
    default = state.http_url if protocol == "http" else state.grpc_url
    return Endpoint(protocol, url or default, state.admin_headers(protocol), Path(state.repo))
