"""Command line of the launcher: `python -m tpserve.server start|stop|status`."""

import dataclasses
import sys
from pathlib import Path

import click

from tpserve.common.cli import private_files, step, user_errors
from tpserve.common.endpoints import HEALTH_PORT
from tpserve.common.options import REPO, STATE_DIR, ports
from tpserve.server import fronts
from tpserve.server.fronts import FRONTS

TLS_CERT = click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="PEM certificate chain: Envoy's listeners speak TLS (with --tls-key).",
)
RECORD = click.option(
    "--record",
    default="0",
    show_default=True,
    help="Record the traffic at the edge in STATE_DIR/traffic: 1 (model, version, protocol, each input's name, "
    "datatype and shape, batch, bytes, status, duration; no values), values (each body too, up to 1 MiB), 0 (off).",
)
RECORD_FILE_MB = click.option(
    "--record-file-mb", type=float, default=64.0, show_default=True, help="A recording file is rotated past this."
)
RECORD_FILES = click.option(
    "--record-files", type=int, default=8, show_default=True, help="Rotated recording files kept (oldest go first)."
)
TLS_KEY = click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM private key.")


def tuning_options(command):
    """tritonserver's own knobs (server.launcher.TritonTuning): SERVER_ARGS, LATENCY_SUMMARIES, LATENCY_QUANTILES."""
    command = click.option(
        "--latency-quantiles",
        default="",
        help="Quantiles the summaries keep, 'q:error,...' (default 0.5:0.05,0.9:0.01,0.99:0.001); each costs "
        "every request.",
    )(command)
    command = click.option(
        "--latency-summaries/--no-latency-summaries",
        default=True,
        show_default=True,
        help="Triton's per-model p50/p90/p99 in /metrics (off saves a server thread ~10-30 us a request).",
    )(command)
    return click.option(
        "--server-args",
        default="",
        help="tritonserver tuning flags, '--flag=value ...': pools and thread counts only (launcher.TUNING_FLAGS).",
    )(command)


def _tuning(server_args: str, latency_summaries: bool, latency_quantiles: str):
    from tpserve.server.triton.launcher import TritonTuning

    return TritonTuning.parse(server_args, latency_summaries, latency_quantiles)


QUEUE_SLO = click.option(
    "--queue-slo-ms",
    "queue_slo",
    default="",
    help="Admission by queue time: the edge refuses a model's new calls at once (HTTP 429, gRPC UNAVAILABLE, retry "
    "hint) while its queue time per request is over this ('20', or 'model=20 *=50'); empty: off.",
)
GRPC_STREAMING = click.option(
    "--grpc-streaming",
    is_flag=True,
    help="Serve gRPC ModelStreamInfer (decoupled models need it). Off, each stream is refused (UNIMPLEMENTED) "
    "before tritonserver reads a request of it: tritonserver 2.51 crashes under concurrent streams whose requests "
    "overlap, whoever the client (docs/security.md). Unary ModelInfer is served either way.",
)
MAX_WAITING = click.option(
    "--max-waiting",
    type=click.IntRange(0),
    default=0,
    help="Requests that may wait per replica behind the edge; past it refused at once with a retry hint "
    "(0: two full batches per instance of the repository's largest model, 64 at least).",
)


@click.group()
def cli():
    """Run the embedded tritonserver on a model repository."""
    private_files()


@cli.command()
@REPO
@ports()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind (keep loopback: see docs/serving.md)."
)
@click.option("--model-control", type=click.Choice(["none", "explicit", "poll"]), default="none", show_default=True)
@click.option("--timeout", type=float, default=180.0, show_default=True, help="Seconds to wait for readiness.")
@click.option(
    "--supervise/--no-supervise",
    default=True,
    show_default=True,
    help="Run under a supervisor that reloads models whose stub died and restarts a crashed server "
    "(model control becomes explicit, every model loaded at start).",
)
@click.option(
    "--health-port", type=int, default=HEALTH_PORT, show_default=True, help="The supervisor's readiness port."
)
@click.option(
    "--front",
    type=click.Choice(FRONTS),
    default="auto",
    show_default=True,
    help="What stands before tritonserver. server: the edge's checks and bounds inside tritonserver's own reads of "
    "its HTTP and gRPC ports, no proxy on the path; envoy: Envoy in front (recording, TLS, canaries by traffic "
    "share); none: tritonserver's own ports unguarded; auto: envoy where --record, --tls-cert or "
    "--internal-http-port asks for it, else server (docs/security.md says what each holds).",
)
@click.option("--edge/--no-edge", default=None, hidden=True, help="Before --front: --edge is envoy, --no-edge none.")
@click.option("--checks-in-server", is_flag=True, hidden=True, help="Before --front: with --no-edge, server.")
@click.option("--max-request-mb", type=float, default=64.0, show_default=True, help="The edge's cap on a body.")
@MAX_WAITING
@QUEUE_SLO
@GRPC_STREAMING
@RECORD
@RECORD_FILE_MB
@RECORD_FILES
@click.option(
    "--internal-http-port",
    type=int,
    default=0,
    help="tritonserver's own HTTP port behind Envoy (brings Envoy in front; default: a free one, listed in "
    "STATE_DIR/replica-0).",
)
@TLS_CERT
@TLS_KEY
@STATE_DIR
@tuning_options
@click.option(
    "--foreground",
    is_flag=True,
    help="Stay after the start (a container's entry): the logs to stdout; SIGTERM or SIGINT drains and stops.",
)
@user_errors
def start(
    repo,
    http_port,
    grpc_port,
    metrics_port,
    host,
    model_control,
    timeout,
    supervise,
    health_port,
    front,
    edge,
    checks_in_server,
    max_request_mb,
    max_waiting,
    queue_slo,
    grpc_streaming,
    internal_http_port,
    tls_cert,
    tls_key,
    state_dir,
    record,
    record_file_mb,
    record_files,
    server_args,
    latency_summaries,
    latency_quantiles,
    foreground,
):
    """Start the server and return once every model is ready (with --foreground: stay until told to stop)."""
    from tpserve.common.endpoints import read_state
    from tpserve.server.edge.recording import record_settings
    from tpserve.server.triton.launcher import ServerSettings, refuse_running, start

    tuning = _tuning(server_args, latency_summaries, latency_quantiles)  # checked before anything starts
    recording = record_settings(record, state_dir, record_file_mb, record_files)
    front, why = fronts.choose(
        _legacy_front(front, edge, checks_in_server),
        record=recording is not None,
        tls=bool(tls_cert or tls_key),
        internal_http_port=internal_http_port,
    )
    _check_front(front, why, supervise, queue_slo)
    step(f"starting tritonserver on {repo} (http {http_port}, grpc {grpc_port}, metrics {metrics_port})")
    ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    refuse_running(state_dir)  # before the checks' file of a server still running there is touched
    (state_dir / fronts.CHECKS_FILE).unlink(missing_ok=True)
    checks = (
        fronts.checks_in_server(repo, state_dir, max_request_mb, max_waiting, queue_slo) if front == "server" else {}
    )
    settings = ServerSettings(
        repo,
        **ports,
        host=host,
        state_dir=state_dir,
        startup_timeout=timeout,
        model_control=model_control,
        tuning=tuning,
        **checks,
        grpc_streaming=grpc_streaming,
    )
    _say_streaming(repo, grpc_streaming, front != "none")
    if front == "envoy":
        tls = _tls(tls_cert, tls_key)
        state = _start_behind_edge(
            settings, health_port, max_request_mb, tls, internal_http_port, recording, max_waiting, queue_slo
        )
    elif supervise:
        from tpserve.server.supervision.supervisor_process import start_supervised

        start_supervised(settings, health_port)
        state = read_state(state_dir)
    else:
        state = start(settings)
    if front == "server":
        click.echo(
            f"edge: http {state.http_url} and grpc {state.grpc_url} checked inside tritonserver's own reads, no "
            f"proxy on the path ({why}; body cap {max_request_mb:g} MB, {settings.max_waiting} calls may wait; "
            "Envoy: --front envoy)"
        )
    elif front == "envoy" and why != "--front envoy":
        click.echo(f"front: Envoy, since {why} (the checks in the server are the default otherwise)")
    elif front == "none":
        click.echo("no front: tritonserver's own ports serve unguarded (trusted clients on loopback only)", err=True)
    if supervise:
        click.echo(f"supervisor: readiness for load balancers at http://{host}:{health_port}/v2/health/ready")
    click.echo(f"tritonserver ready: pid {state.pid}, http {state.http_url}, grpc {state.grpc_url}, log {state.log}")
    for model, why in state.left_out.items():  # the rest serves; these could not here
        click.echo(f"not served: {model}: {why}")
    click.echo(f"admin key (header '{'admin-key'}') in {state.admin_key_file}")
    if foreground:
        from tpserve.server.foreground import hold

        sys.exit(hold(state_dir, stop_everything))


def _say_streaming(repo: Path, streaming: bool, guarded: bool) -> None:
    """Where the front refuses streams (no --grpc-streaming), name the repository's decoupled models: they answer
    only on streams, so they are loaded but unreachable until the server starts with --grpc-streaming."""
    from tpserve.server.edge.request_checks import decoupled_models

    found = decoupled_models(Path(repo)) if guarded and not streaming else []
    if found:
        click.echo(
            f"note: {', '.join(found)} answer(s) only on gRPC streams, which this server refuses; start it with "
            "--grpc-streaming (GRPC_STREAMING=1) to serve them, knowing tritonserver 2.51 crashes under concurrent "
            "streams (docs/security.md)",
            err=True,
        )


def _legacy_front(front: str, edge: bool | None, checks_in_server: bool) -> str:
    """--front, or what the flags before it (--edge/--no-edge, --checks-in-server) ask for."""
    if edge is None and not checks_in_server:
        return front
    if front != "auto":
        raise click.UsageError("--front replaces --edge/--no-edge and --checks-in-server: give only --front")
    if checks_in_server and edge:
        raise click.UsageError("--checks-in-server is for --no-edge (use --front server)")
    return "server" if checks_in_server else ("envoy" if edge else "none")


def _check_front(front: str, why: str, supervise: bool, queue_slo: str) -> None:
    if front == "envoy" and not supervise:
        raise click.UsageError(f"Envoy in front ({why}) needs the supervisor: drop --no-supervise")
    if queue_slo and not (supervise and front != "none"):
        raise click.UsageError(
            "--queue-slo-ms needs the supervisor and a front's checks (drop --no-supervise and --front none)"
        )


def _start_behind_edge(
    settings,
    health_port: int,
    max_request_mb: float,
    tls=None,
    internal_http_port: int = 0,
    record=None,
    max_waiting: int = 0,
    queue_slo: str = "",
):
    """One supervised server whose HTTP port is Envoy's edge (server/edge/request_checks.py); its state as clients
    see it."""
    from tpserve.common.endpoints import read_state
    from tpserve.server.edge.envoy_config import Balancing
    from tpserve.server.edge.request_checks import MIB, EdgeLimits
    from tpserve.server.single import SingleSettings, start_single

    limits = EdgeLimits(max_request_bytes=int(max_request_mb * MIB))
    single = SingleSettings(
        settings.repo,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        metrics_port=settings.metrics_port,
        health_port=health_port,
        internal_http_port=internal_http_port,
        host=settings.host,
        state_dir=settings.state_dir,
        startup_timeout=settings.startup_timeout,
        tuning=settings.tuning,
        edge=limits,
        tls=tls,
        record=record,
        balancing=Balancing(max_requests=max_waiting),
        queue_slo=queue_slo,
        grpc_streaming=settings.grpc_streaming,
    )
    start_single(single)
    state = read_state(settings.state_dir / "replica-0")
    click.echo(
        f"edge: http {settings.host}:{settings.http_port} and grpc {settings.host}:{settings.grpc_port} through Envoy "
        f"(body cap {max_request_mb:g} MB; tritonserver's own http {state.http_url} and grpc {state.grpc_url} are "
        "internal: only this user's processes connect)"
    )
    if record is not None:
        kept = "shapes and bodies" if record.values else "shapes, no values"
        click.echo(f"recording: http and grpc through the edge ({kept}) in {record.folder}")
    front = read_state(settings.state_dir)  # the ports clients use; pid and log of the server itself
    return dataclasses.replace(front, pid=state.pid, log=state.log, left_out=state.left_out)


@cli.command(hidden=True)
@click.option("--repo", type=click.Path(path_type=Path), required=True)
@click.option("--ports", nargs=4, type=int, required=True, help="http grpc metrics health")
@click.option("--host", default="127.0.0.1")
@click.option("--timeout", type=float, default=180.0)
@click.option("--drain", type=float, default=0.0, help="Seconds of 'not ready' before stopping the server.")
@click.option("--probes", nargs=3, type=float, default=(10.0, 5.0, 3), help="interval timeout threshold")
@click.option("--internal", default="", help="Comma-separated ports behind the edge: http, grpc, metrics.")
@click.option("--cancelled-calls", default="", help="The edge's cancelled-calls table (empty: none).")
@click.option("--backlog-slot", default=0, type=int, help="This server's slot of the edge's backlog file.")
@click.option("--admission-table", default="", help="The edge's admission table (empty: none).")
@click.option("--queue-slo", default="", help="Queue-time budgets the edge admits by ('20' or 'model=20 *=50').")
@click.option("--http-checks", default="", help="The HTTP checks' rules file, read inside tritonserver (empty: none).")
@click.option(
    "--http-check-limits",
    default="",
    help="Their limits: max_body_bytes,max_head_bytes,max_connections,max_held_bytes,head_timeout_ms.",
)
@click.option(
    "--max-waiting-calls", default=0, type=int, help="With the checks in the server: calls it may run (0: any)."
)
@GRPC_STREAMING
@click.option("--retry", nargs=2, type=float, default=(1.0, 30.0), help="A failed reload's first and longest wait.")
@STATE_DIR
@tuning_options
def supervise(
    repo,
    ports,
    host,
    timeout,
    drain,
    probes,
    internal,
    cancelled_calls,
    backlog_slot,
    admission_table,
    queue_slo,
    http_checks,
    http_check_limits,
    max_waiting_calls,
    grpc_streaming,
    retry,
    state_dir,
    server_args,
    latency_summaries,
    latency_quantiles,
):
    """Run the supervisor in the foreground (what `start --supervise` spawns)."""
    import logging

    from tpserve.server.triton.launcher import ServerSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from tpserve.server.supervision.probes import ProbeSettings
    from tpserve.server.supervision.supervisor import RetrySettings, serve

    http_port, grpc_port, metrics_port, health_port = ports
    ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    behind = tuple(name for name in internal.split(",") if name)
    tuning = _tuning(server_args, latency_summaries, latency_quantiles)
    table = Path(cancelled_calls) if cancelled_calls else None
    settings = ServerSettings(
        repo,
        **ports,
        host=host,
        state_dir=state_dir,
        startup_timeout=timeout,
        internal=behind,
        tuning=tuning,
        cancelled_calls=table,
        backlog_slot=backlog_slot,
        admission_table=Path(admission_table) if admission_table else None,
        queue_budgets=queue_slo,
        http_checks=Path(http_checks) if http_checks else None,
        http_check_limits=http_check_limits,
        max_waiting=max_waiting_calls,
        grpc_streaming=grpc_streaming,
    )
    probing = ProbeSettings(probes[0], probes[1], int(probes[2]))
    serve(settings, health_port, drain, probing, RetrySettings(*retry))


@cli.command()
@click.option("--replicas", type=click.IntRange(1), default=2, show_default=True)
@REPO
@ports("Envoy's HTTP listener.", "Envoy's gRPC listener.", "Envoy's GET /stats/prometheus only.")
@click.option("--replica-base-port", type=int, default=0, help="Replica i on ports base+4i..base+4i+3 (0: free ports).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--timeout", type=float, default=180.0, show_default=True, help="Seconds per replica to get ready.")
@click.option("--gpu-per-replica", is_flag=True, help="Replica i sees GPU i only (CUDA_VISIBLE_DEVICES=i).")
@MAX_WAITING
@QUEUE_SLO
@GRPC_STREAMING
@TLS_CERT
@TLS_KEY
@STATE_DIR
@RECORD
@RECORD_FILE_MB
@RECORD_FILES
@tuning_options
@user_errors
def cluster(
    replicas,
    repo,
    http_port,
    grpc_port,
    metrics_port,
    replica_base_port,
    host,
    timeout,
    gpu_per_replica,
    max_waiting,
    queue_slo,
    grpc_streaming,
    tls_cert,
    tls_key,
    state_dir,
    record,
    record_file_mb,
    record_files,
    server_args,
    latency_summaries,
    latency_quantiles,
):
    """Start REPLICAS supervised tritonservers behind Envoy; return once Envoy routes to every one."""
    from tpserve.server.cluster import ClusterSettings, start_cluster
    from tpserve.server.edge.envoy_config import Balancing
    from tpserve.server.edge.recording import record_settings

    settings = ClusterSettings(
        repo,
        replicas=replicas,
        http_port=http_port,
        grpc_port=grpc_port,
        admin_port=metrics_port,
        host=host,
        state_dir=state_dir,
        startup_timeout=timeout,
        tuning=_tuning(server_args, latency_summaries, latency_quantiles),
        gpu_per_replica=gpu_per_replica,
        replica_base_port=replica_base_port,
        tls=_tls(tls_cert, tls_key),
        record=record_settings(record, state_dir, record_file_mb, record_files),
        balancing=Balancing(max_requests=max_waiting * replicas),
        queue_slo=queue_slo,
        grpc_streaming=grpc_streaming,
    )
    _say_streaming(repo, grpc_streaming, True)
    state = start_cluster(settings)
    click.echo(
        f"envoy: http {host}:{http_port}, grpc {host}:{grpc_port}, "
        f"stats {host}:{metrics_port}/stats/prometheus, "
        f"admin: unix socket {state_dir}/envoy-admin.sock (0600)"
    )
    if state.recording:
        click.echo(f"recording: http and grpc in {state.recording}")
    for replica in state.replicas:
        ports = f"http {replica.http_port}, grpc {replica.grpc_port}, readiness {replica.health_port}"
        click.echo(f"  {replica.name}: {ports} (log {state_dir}/{replica.name}/tritonserver.log)")


def _tls(cert, key):
    if bool(cert) != bool(key):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key (TLS_CERT= and TLS_KEY=)")
    return (str(Path(cert).resolve()), str(Path(key).resolve())) if cert else None


@cli.command("envoy-run", hidden=True)
@click.option("--config", type=click.Path(path_type=Path), required=True)
@click.option("--log", type=click.Path(path_type=Path), required=True)
@click.option("--record-dir", type=click.Path(path_type=Path), default=None)
@click.option("--record-file-mb", type=float, default=64.0)
@click.option("--record-files", type=int, default=8)
@click.option("--admin-socket", type=click.Path(path_type=Path), default=None)
def envoy_run(config, log, record_dir, record_file_mb, record_files, admin_socket):
    """Run Envoy in the foreground, restarting it if it dies, rotating a recording (what `cluster` starts)."""
    from tpserve.server.edge.envoy_process import run
    from tpserve.server.edge.front import envoy_binary

    keep = None
    if record_dir is not None:
        from tpserve.server.edge.front import admin_get
        from tpserve.server.edge.recording import RecordSettings, rotate

        record = RecordSettings(record_dir, max_file_mb=record_file_mb, max_files=record_files)
        keep = lambda: rotate(record, lambda: admin_get(admin_socket, "/reopen_logs", "POST"))  # noqa: E731
    raise SystemExit(run(envoy_binary(), config, log, keep))


@cli.command("cluster-restart")
@STATE_DIR
@user_errors
def cluster_restart(state_dir):
    """Rolling restart of the cluster's replicas, one at a time, each back in Envoy before the next."""
    from tpserve.server.stack import restart_replicas

    for done in restart_replicas(state_dir):
        click.echo(f"{done['replica']}: restarted and routed again in {done['seconds']} s")


@cli.command(
    "tritonserver", context_settings={"ignore_unknown_options": True, "help_option_names": []}, add_help_option=False
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@user_errors
def tritonserver(args):
    """The embedded tritonserver with every argument given (bin/tritonserver: Model Analyzer's
    --triton-server-path), set up as `start` sets it up, without the admin key or the edge."""
    from tpserve.server.triton.standalone import exec_tritonserver

    exec_tritonserver(list(args))


@cli.command("build-shim")
@user_errors
def build_shim():
    """Compile the project's C into .tools/ (again only what changed): the shim (server/triton/triton_shim.c and
    front/*.c), the edge's modules (server/edge/checks_module.c, record_grpc.c, cancel_notice.c) and, where this
    host has Python's headers and a shared libpython, the in-process backend (triton_models/inprocess/native/)."""
    from tpserve.common.errors import ServerError
    from tpserve.server.edge import cancel_table, request_checks
    from tpserve.server.edge.record_module import build_module
    from tpserve.server.triton.inprocess_build import build_native
    from tpserve.server.triton.preloads import build_library

    click.echo(f"admin-key shim: {build_library()}")
    click.echo(f"the edge's HTTP checks: {request_checks.build_module()}")
    click.echo(f"gRPC recorder: {build_module()}")
    click.echo(f"cancelled-calls notice: {cancel_table.build_module()}")
    try:
        click.echo(f"in-process backend: {build_native()}")
    except ServerError as err:  # optional: only --inprocess models need it, and it is built where they serve
        click.echo(f"in-process backend: not built here ({err})")


@cli.command()
@STATE_DIR
def stop(state_dir):
    """Stop the server started from STATE_DIR (and its supervisor; in a container: the container)."""
    from tpserve.server import container

    if container.record(state_dir) is not None:  # served from a container: its pids are not this host's
        click.echo(container.stop(state_dir))
        return
    click.echo(stop_everything(state_dir))


def stop_everything(state_dir: Path) -> str:
    """Stop what was started from state_dir (a cluster, the edge and its server, or a server); what was stopped."""
    from tpserve.server.stack import is_stack, read_stack, stop_stack
    from tpserve.server.supervision.supervisor_process import stop_supervisor
    from tpserve.server.triton.launcher import stop

    single = is_stack(state_dir) and read_stack(state_dir).single
    if stop_stack(state_dir):
        return "tritonserver and its edge stopped" if single else "cluster stopped (envoy and every replica)"
    supervised = stop_supervisor(state_dir)
    stopped = stop(state_dir) or supervised
    return "tritonserver stopped" if stopped else "no tritonserver was running"


@cli.command()
@STATE_DIR
@user_errors
def status(state_dir):
    """Show the running server's pid, ports and log."""
    from tpserve.common.endpoints import read_state
    from tpserve.server import container
    from tpserve.server.stack import is_stack, read_stack

    state = read_state(state_dir)
    boxed = container.record(state_dir)
    inside = "" if boxed is None else f"in the container {boxed['name']} ({boxed['engine']}, image {boxed['image']}); "
    if not is_stack(state_dir):
        guarded = (state_dir / fronts.CHECKS_FILE).exists()  # written at each start with the checks, else removed
        front = "checks inside tritonserver's reads" if guarded else "none (tritonserver's own ports, unguarded)"
        click.echo(f"front: {front}")
        if inside:  # its pids are the container's
            click.echo(f"  {inside}pids inside it")
        click.echo(f"pid {state.pid}, http {state.http_url}, grpc {state.grpc_url}, repo {state.repo}, log {state.log}")
        click.echo(_models_line(state))
        return
    stack = read_stack(state_dir)
    front = "edge (Envoy, HTTP and gRPC)" if stack.single else "Envoy"
    click.echo(
        f"{front}: pid {state.pid}, http {state.http_url}, grpc {state.grpc_url}, repo {state.repo}, log {state.log}"
    )
    if stack.recording:
        click.echo(f"  recording the traffic in {stack.recording}")
    if inside:  # its pids are the container's; its server's own ports take no one but its user
        click.echo(f"  {inside}pids inside it")
    for replica in stack.replicas:
        inner = read_state(state_dir / replica.name)
        click.echo(
            f"  {replica.name}: tritonserver pid {inner.pid}, http {inner.http_url}, grpc {inner.grpc_url}, "
            f"readiness {replica.health_port}, log {inner.log}"
        )
        click.echo("  " + _models_line(state if boxed is not None else inner))


def _models_line(state) -> str:
    """The server's models as its repository index says them: name, version and state (with why, if not ready)."""
    try:
        with state.endpoint("http").client() as client:
            index = client.get_model_repository_index(headers=state.admin_headers("http"))
    except Exception as err:  # a server that does not answer: said, not raised
        return f"models: not known ({' '.join(str(err).split())[:200]})"
    items = [
        f"{m['name']} v{m.get('version') or '-'} {m.get('state') or 'UNKNOWN'}"
        + (f" ({m['reason']})" if m.get("reason") and m.get("state") != "READY" else "")
        for m in sorted(index, key=lambda m: (m["name"], m.get("version", "")))
    ]
    return "models: " + (", ".join(items) if items else "none")


@cli.command("image")
@click.option(
    "--base-image", default="", help="A Debian 12 image to build on (default: one made from Debian's packages)."
)
@click.option("--tag", default="", help="The image's name (default: localhost/tpserve-server:latest).")
@user_errors
def image(base_image, tag):
    """Build the server image for hosts without a GPU or the NGC registry (docker/Dockerfile.embedded)."""
    from tpserve.server import container

    click.echo(f"image ready: {container.build_image(base_image, tag or container.IMAGE)}")


@cli.command("container-start")
@REPO
@ports()
@click.option("--health-port", type=int, default=HEALTH_PORT, show_default=True, help="The supervisor's readiness.")
@click.option("--image", "tag", default="", help="The image (default: localhost/tpserve-server:latest).")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds to wait for readiness.")
@STATE_DIR
@user_errors
def container_start(repo, http_port, grpc_port, metrics_port, health_port, tag, timeout, state_dir):
    """Serve REPO from the server image, supervised, behind the edge, on this host's loopback ports."""
    from tpserve.server import container

    ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    serve = container.ContainerServe(repo, state_dir, **ports, health_port=health_port, timeout_s=timeout)
    state = container.start(dataclasses.replace(serve, image=tag) if tag else serve)
    click.echo(f"tritonserver ready in a container: http {state.http_url}, grpc {state.grpc_url} (through the edge)")
    click.echo(f"supervisor: readiness at http://127.0.0.1:{health_port}/v2/health/ready; logs in {state_dir}")
    for model, why in state.left_out.items():
        click.echo(f"not served: {model}: {why}")
    click.echo(f"admin key (header 'admin-key') in {state.admin_key_file}; stop with `make stop-docker`")


@cli.command("container-stop")
@STATE_DIR
@user_errors
def container_stop(state_dir):
    """Stop and remove the container serving from STATE_DIR."""
    from tpserve.server import container

    click.echo(container.stop(state_dir))


if __name__ == "__main__":
    cli()
