"""Where the server is and how to talk to it, over HTTP or gRPC."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tpserve.common.endpoints import (
    ADMIN_HEADER,
    GRPC_ADMIN_HEADER,
    GRPC_RESTRICTED_PREFIX,
    STATE_DIR,
    Endpoint,
    read_state,
)
from tpserve.common.errors import ClientError, ServerError


def as_dict(message) -> dict:
    """A tritonclient answer as a dict: HTTP answers already are one; gRPC answers are protobuf messages."""
    if isinstance(message, dict):
        return message
    from google.protobuf import json_format

    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@contextlib.contextmanager
def refused_as_client_error(what: str):
    """Turn tritonclient's InferenceServerException into a ClientError naming what was asked."""
    from tritonclient.utils import InferenceServerException

    try:
        yield
    except InferenceServerException as err:
        raise ClientError(f"{what}: server refused the request ({err.status()}): {err.message()}") from err


def endpoint(
    protocol: str = "http",
    url: str | None = None,
    state_dir: Path = STATE_DIR,
    headers: dict | None = None,
    tls: bool = False,
    ca_file: str | None = None,
    key_file: Path | None = None,
) -> Endpoint:
    """The endpoint of the server started from state_dir, or of url if given. A server we did not start
    needs no state folder: its admin key, if any, comes from key_file (read_key_file) or is one of the headers
    ('admin-key: ...')."""
    headers = dict(headers or {})
    if key_file is not None:
        admin = read_key_file(key_file, protocol)
    else:
        given_key = [v for k, v in headers.items() if k.lower() in (ADMIN_HEADER, GRPC_ADMIN_HEADER)]
        admin = {(ADMIN_HEADER if protocol == "http" else GRPC_ADMIN_HEADER): v for v in given_key}
    try:
        state = read_state(state_dir)
    except ServerError:
        if url is None:
            raise ClientError(
                f"no server known: none was started from {state_dir} and no --url was given; "
                "run `make serve` or pass --url HOST:PORT (URL=HOST:PORT with make)"
            ) from None
        return Endpoint(protocol, url, admin, None, headers=headers, tls=tls, ca_file=ca_file)
    if url is not None:  # another server than ours: our key and repository do not apply
        return Endpoint(protocol, url, admin, None, headers=headers, tls=tls, ca_file=ca_file)
    default = state.http_url if protocol == "http" else state.grpc_url
    keys = admin or state.admin_headers(protocol)
    return Endpoint(protocol, default, keys, Path(state.repo), headers=headers, tls=tls, ca_file=ca_file)


def read_key_file(path: Path, protocol: str) -> dict:
    """The restricted-API header a key file holds: the key alone (sent as 'admin-key', ours) or
    'Header-Name: key' (the name a Triton was started with, --http-restricted-api=...:NAME=KEY). gRPC sends it
    as triton-grpc-protocol-NAME, as Triton expects. The key stays out of every argv."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ClientError(f"--admin-key-file {path}: cannot read it ({err})") from None
    name, sep, key = text.partition(":")
    if not sep or " " in name.strip() or not name.strip():
        name, key = ADMIN_HEADER, text
    name, key = name.strip().lower().removeprefix(GRPC_RESTRICTED_PREFIX), key.strip()
    if not key or any(ord(c) < 32 for c in key):
        raise ClientError(
            f"--admin-key-file {path}: expected one line, the key or 'Header-Name: key' "
            "(it is empty or has several lines)"
        )
    return {name if protocol == "http" else GRPC_RESTRICTED_PREFIX + name: key}


def parse_headers(items) -> dict:
    """--header 'Name: value' (repeatable) -> {name: value}."""
    found = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ClientError(f"--header {item!r}: expected 'Name: value'")
        found[name.strip().lower()] = value.strip()
    return found
