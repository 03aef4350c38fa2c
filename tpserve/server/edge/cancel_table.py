"""The edge's cancelled-calls table: calls nobody waits for, which the models then answer without running.

The edge's dynamic module (server/edge/cancel_notice.c) gives every call an id, x-edge-call, and writes the id of
each
call that ends without an answer into this table, a file of the server's state folder (0600); tritonserver passes
the id on to the model as a request parameter (--grpc-header-forward-pattern, --http-header-forward-pattern), and
the Python-backend models look it up before they compute (triton_models/python_backend/cancelled_calls.py). A cancelling
client's call so costs the server a lookup instead of a run, whatever reached the model's queue.

Beside it, the backlog file: one 64-byte slot per server, where its guard (server/triton/front/bounds.c) counts the
calls
the edge reset that it still runs. The edge refuses new calls of cancelling connections while the sum is at its
bound (BACKLOG_PER_SERVER per server), and everyone's at 4 times it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tpserve.common.errors import ServerError
from tpserve.server.edge.record_module import MODULES_DIR, compile_module, dynamic_module_filter
from tpserve.triton_models.python_backend.cancelled_calls import PARAMETER, SLOTS, VARIABLE

SOURCE = Path(__file__).with_name("cancel_notice.c")
LIBRARY = MODULES_DIR / "libcancel_notice.so"
TABLE = "cancelled_calls"
BACKLOG = "edge_backlog"
BACKLOG_SLOTS, BACKLOG_LINE = (
    64,
    64,
)  # as server/triton/front/bounds.c and server/edge/cancel_notice.c have them
BACKLOG_PER_SERVER = 64  # calls nobody waits for that one server may hold before cancelling clients are refused
GUARD_VARIABLE = "TRITON_GUARD_BACKLOG"
FORWARD_PATTERN = f"^{PARAMETER}$"


def build_module(force: bool = False) -> Path:
    """Compile cancel_notice.c into .tools/envoy_modules/ (rebuilt when the source is newer).

    Raises:
        ServerError: no C compiler, or the compile failed.
    """
    return compile_module(SOURCE, LIBRARY, "the cancelled-calls notice", "or serve without the edge", force)


def fresh_file(path: Path, size: int) -> Path:
    """A new file of size zero bytes at path (0600, made exclusively, never through a link); its resolved path."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return path.resolve()


def make_table(state_dir: Path) -> Path:
    """A fresh, empty table in state_dir (0600, SLOTS ids of 8 bytes) and the backlog file beside it (0600, zeros);
    the table's path."""
    fresh_file(Path(state_dir) / BACKLOG, BACKLOG_SLOTS * BACKLOG_LINE)
    return fresh_file(Path(state_dir) / TABLE, SLOTS * 8)


def backlog_of(table: Path) -> Path:
    """The backlog file of a table (beside it)."""
    return Path(table).with_name(BACKLOG)


def read_backlog(table: Path) -> list[int]:
    """Each server's count of calls it runs that nobody waits for, by slot."""
    data = backlog_of(table).read_bytes()
    return [int.from_bytes(data[i : i + 8], "little") for i in range(0, BACKLOG_SLOTS * BACKLOG_LINE, BACKLOG_LINE)]


def module_config(table: Path, servers: int, admission: Path | None = None) -> str:
    """The module's configuration: the two files (hex of their paths) and the bound for this many servers; the
    admission table where the edge admits by queue time (server/edge/admission_table.py) and the regions in use."""
    hexed = lambda path: str(path).encode().hex()  # noqa: E731
    limit = BACKLOG_PER_SERVER * max(1, servers)
    text = f"table {hexed(table)}\nbacklog {hexed(backlog_of(table))}\nlimit {limit}\n"
    return text + (f"admission {hexed(admission)}\nreplicas {max(1, servers)}\n" if admission else "")


def module_filter(table: Path, servers: int = 1, admission: Path | None = None) -> dict:
    """The HTTP filter that gives each call its id, notes the calls that end unanswered, refuses cancelling
    clients while the servers' backlog is at its bound, and (admission given) the calls of a model over its
    queue-time budget (built first where it is not)."""
    config = module_config(table, servers, admission)
    return dynamic_module_filter("edge.cancel_notice", build_module(), "cancel_notice", config)


def server_flags() -> list[str]:
    """tritonserver's flags that pass the call's id to the model as a request parameter."""
    return [f"--grpc-header-forward-pattern={FORWARD_PATTERN}", f"--http-header-forward-pattern={FORWARD_PATTERN}"]


def server_environment(table: Path, slot: int = 0) -> dict[str, str]:
    """What tells the models (their stubs inherit tritonserver's environment) where the table is, and the guard
    which slot of the backlog file is its server's."""
    if not 0 <= slot < BACKLOG_SLOTS:
        raise ServerError(f"backlog slot {slot}: a cluster has at most {BACKLOG_SLOTS} replicas behind one edge")
    env = {VARIABLE: str(table)}
    if backlog_of(table).is_file():
        env[GUARD_VARIABLE] = f"{slot}:{backlog_of(table)}"
    return env
