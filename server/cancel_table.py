"""The edge's cancelled-calls table: calls nobody waits for, which the models then answer without running.

The edge's dynamic module (server/cancel_notice.c) gives every call an id, x-edge-call, and writes the id of each
call that ends without an answer into this table, a file of the server's state folder (0600); tritonserver passes
the id on to the model as a request parameter (--grpc-header-forward-pattern, --http-header-forward-pattern), and
the Python-backend models look it up before they compute (triton_models/cancelled_calls.py). A cancelling
client's call so costs the server a lookup instead of a run, whatever reached the model's queue.
"""

from __future__ import annotations

import os
from pathlib import Path

from server.record_module import MODULE_FILTER, MODULES_DIR, STRING_VALUE, compile_module
from triton_models.cancelled_calls import PARAMETER, SLOTS, VARIABLE

SOURCE = Path(__file__).with_name("cancel_notice.c")
LIBRARY = MODULES_DIR / "libcancel_notice.so"
TABLE = "cancelled_calls"
FORWARD_PATTERN = f"^{PARAMETER}$"


def build_module(force: bool = False) -> Path:
    """Compile cancel_notice.c into .tools/envoy_modules/ (rebuilt when the source is newer).

    Raises:
        ServerError: no C compiler, or the compile failed.
    """
    return compile_module(SOURCE, LIBRARY, "the cancelled-calls notice", "or serve without the edge", force)


def make_table(state_dir: Path) -> Path:
    """A fresh, empty table in state_dir (0600, SLOTS ids of 8 bytes); its path."""
    path = Path(state_dir) / TABLE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, SLOTS * 8)
    finally:
        os.close(fd)
    return path.resolve()


def module_filter(table: Path) -> dict:
    """The HTTP filter that gives each call its id and notes the calls that end unanswered (built first where it is
    not)."""
    return {
        "name": "edge.cancel_notice",
        "typed_config": {
            "@type": MODULE_FILTER,
            "dynamic_module_config": {"module": {"local": {"filename": str(build_module())}}},
            "filter_name": "cancel_notice",
            "filter_config": {"@type": STRING_VALUE, "value": f"table {str(table).encode().hex()}\n"},
        },
    }


def server_flags() -> list[str]:
    """tritonserver's flags that pass the call's id to the model as a request parameter."""
    return [f"--grpc-header-forward-pattern={FORWARD_PATTERN}", f"--http-header-forward-pattern={FORWARD_PATTERN}"]


def server_environment(table: Path) -> dict[str, str]:
    """What tells the models (their stubs inherit tritonserver's environment) where the table is."""
    return {VARIABLE: str(table)}
