"""What stands in front of one tritonserver (`server start --front`), and the server as `server start` serves it.

- server (the default): the edge's checks and bounds run inside tritonserver's own reads of its HTTP and gRPC
  ports (server/triton/front/: http_front.c, h2_reading.c): no second process on a request's path;
- envoy: Envoy in front (server/edge/), for what only it does: recording, TLS, a canary by traffic share;
- none: tritonserver's own ports, unguarded (a trusted client on loopback only).

`auto` picks envoy where an option only Envoy serves is given, else server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tpserve.common import endpoints
from tpserve.common.errors import ConfigError

FRONTS = ("auto", "server", "envoy", "none")
CHECKS_FILE = "http_checks.json"  # in the state folder: the HTTP checks' rules, there while the front is server
HEAD_TIMEOUT_MS = 10_000  # a request's head must arrive within this of its first byte, as at Envoy


def choose(front: str, *, record: bool = False, tls: bool = False, internal_http_port: int = 0) -> tuple[str, str]:
    """The front to start and why, for `--front` and the options given with it.

    Raises:
        ConfigError: an option asks for Envoy and the front chosen is another.
    """
    needs = [
        name
        for name, given in (("--record", record), ("--tls-cert", tls), ("--internal-http-port", internal_http_port))
        if given
    ]
    if front == "auto":
        if needs:
            return "envoy", f"{', '.join(needs)} need(s) Envoy in front"
        return "server", "the default"
    if needs and front != "envoy":
        raise ConfigError(
            f"{', '.join(needs)} need(s) Envoy in front, and --front is {front}: drop them or use "
            "--front envoy (FRONT=envoy)"
        )
    return front, f"--front {front}"


def checks_in_server(
    repo: Path, state_dir: Path, max_request_mb: float = 64.0, max_waiting: int = 0, queue_slo: str = ""
) -> dict:
    """ServerSettings fields that run the edge's checks inside tritonserver: the HTTP checks' rules file, written
    into the state folder (0600), their limits, the waiting bound (max_waiting, else the repository's) and, with a
    queue_slo, the admission table the supervisor marks and the guard reads; and a fresh cancelled-calls table, in
    which the guard notes the calls their clients left (server/triton/front/call_ids.h) for the models to skip."""
    from tpserve.server.edge import admission_table, cancel_table
    from tpserve.server.edge.admission import waiting_bound
    from tpserve.server.edge.request_checks import MIB, EdgeLimits, checks_json, model_rules
    from tpserve.server.triton.launcher import private_state

    limits = EdgeLimits(max_request_bytes=int(max_request_mb * MIB))
    path = private_state(state_dir) / CHECKS_FILE
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(checks_json(model_rules(Path(repo)), limits))
    head, budget = limits.max_header_kb * 1024, max(1 << 30, 16 * limits.max_request_bytes)
    bounds = f"{limits.max_request_bytes},{head},{limits.max_connections},{budget},{HEAD_TIMEOUT_MS}"
    found = {"http_checks": path, "http_check_limits": bounds, "max_waiting": max_waiting or waiting_bound(Path(repo))}
    found["cancelled_calls"] = cancel_table.make_table(state_dir)  # each call's id; the guard notes those left
    if queue_slo:
        found.update(admission_table=admission_table.make_table(state_dir), queue_budgets=queue_slo)
    return found


@contextmanager
def served_as_started(
    repo: Path, state_dir: Path, front: str = "server", direct: bool = True, **options
) -> Iterator[tuple[endpoints.ServerState, endpoints.ServerState | None]]:
    """One supervised server as `server start` serves it, on free 127.0.0.1 ports, for the length of a with block;
    yields (served, direct): the state clients use and, with direct, a server without a front to set its figure
    beside (for front envoy, tritonserver's own port behind it; for front server, a plain server of the same
    repository in state_dir/plain, since the checks sit in the served one's own ports). Always stopped.

    options: ServerSettings fields both servers share (startup_timeout, tuning, ragged_stats, ...); max_waiting:
    the served one's waiting bound (MAX_WAITING=; 0: the repository's).
    """
    if front == "envoy":
        with _behind_envoy(repo, state_dir, **options) as pair:
            yield pair[0], (pair[1] if direct else None)
        return
    from tpserve.server.triton.launcher import refuse_running

    for folder in (state_dir, state_dir / "plain"):
        refuse_running(folder)  # before the checks' files or records of a server running there are touched
    ports, waiting = endpoints.free_ports(7), options.pop("max_waiting", 0)  # the ports at once: two servers start
    if not direct:
        with _guarded(repo, state_dir, ports[:4], waiting, **options) as served:
            yield served, None
        return
    from concurrent.futures import ThreadPoolExecutor

    from tpserve.server.triton import launcher

    launcher.private_state(state_dir)
    with ThreadPoolExecutor(1) as pool:  # both load at once: a compiled model's warm-up takes minutes on each
        plain = pool.submit(_plain, repo, state_dir / "plain", ports[4:], options)
        try:
            with _guarded(repo, state_dir, ports[:4], waiting, **options) as served:
                yield served, plain.result()
        finally:
            plain.exception() or launcher.stop(state_dir / "plain")


def _plain(repo: Path, state_dir: Path, ports: list[int], options: dict) -> endpoints.ServerState:
    from tpserve.server.triton import launcher

    http, grpc, metrics = ports
    settings = launcher.ServerSettings(
        repo, http_port=http, grpc_port=grpc, metrics_port=metrics, state_dir=state_dir, **options
    )
    return launcher.start(settings)


@contextmanager
def _guarded(
    repo: Path, state_dir: Path, ports: list[int], max_waiting: int = 0, **options
) -> Iterator[endpoints.ServerState]:
    from tpserve.server.supervision.supervisor_process import start_supervised, stop_supervisor
    from tpserve.server.triton import launcher

    http, grpc, metrics, health = ports
    checks = checks_in_server(repo, state_dir, max_waiting=max_waiting)
    settings = launcher.ServerSettings(
        repo, http_port=http, grpc_port=grpc, metrics_port=metrics, state_dir=state_dir, **checks, **options
    )
    start_supervised(settings, health)
    try:
        yield endpoints.read_state(state_dir)
    finally:
        stop_supervisor(state_dir)
        launcher.stop(state_dir)


@contextmanager
def _behind_envoy(repo: Path, state_dir: Path, **options):
    from tpserve.server.single import one_behind_edge, start_single
    from tpserve.server.stack import stop_stack

    start_single(one_behind_edge(repo, state_dir, **options))
    try:
        yield endpoints.read_state(state_dir), endpoints.read_state(state_dir / "replica-0")
    finally:
        stop_stack(state_dir)
