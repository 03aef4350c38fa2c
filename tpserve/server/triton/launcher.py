"""Start, await and stop the embedded tritonserver (from the nvidia-pytriton wheel)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from tpserve.common.endpoints import (
    ADMIN_HEADER,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    STATE,
    STATE_DIR,
    ServerState,
    free_ports,
    read_state,
    write_state,
)
from tpserve.common.errors import ConfigError, ServerError
from tpserve.server.edge import cancel_table
from tpserve.server.triton.inprocess_build import build_inprocess, uses_inprocess
from tpserve.server.triton.installed import find_install, prepare_backends, server_environment
from tpserve.server.triton.preloads import PLACEHOLDER, pass_secret
from tpserve.server.triton.processes import (
    end_orphaned_stubs,
    is_tritonserver,
    regions_of,
    remember_regions,
    remove_regions,
    terminate_group,
)
from tpserve.triton_models.runtime.private_dirs import UnsafeFolderError, check_private, kernel_cache_env

CHILDREN: dict[int, subprocess.Popen] = {}  # servers started by this process, kept to read their exit status
INTERNAL_PORTS = ("http", "grpc", "metrics")
RESTRICTED = ("model-repository", "shared-memory", "statistics", "trace", "logging")
SUPERVISOR_STATE = "supervisor.json"  # the supervisor's record in its state dir: pid, health port, ready
CACHE_BYTES = 32 << 20  # the response cache, for models that enable it


TUNING_FLAGS = (
    "--grpc-infer-allocation-pool-size",
    "--grpc-max-response-pool-size",
    "--http-thread-count",
    "--buffer-manager-thread-count",
    "--pinned-memory-pool-byte-size",
    "--cuda-memory-pool-byte-size",
    "--model-load-thread-count",
)
DEFAULT_QUANTILES = "0.5:0.05,0.9:0.01,0.99:0.001"  # p50, p90, p99; tritonserver 2.51 also keeps 0.95 and 0.999


def check_tuning_args(words: tuple[str, ...]) -> None:
    """Raises ConfigError for a word that is not --flag=value, a flag not in TUNING_FLAGS, or a value with other
    than letters, digits and ':._-'."""
    for word in words:
        flag, sep, value = word.partition("=")
        plain = value and all(c.isalnum() or c in ":._-" for c in value)
        if not sep or flag not in TUNING_FLAGS or not plain:
            raise ConfigError(
                f"SERVER_ARGS: {word!r} is not one of tritonserver's tuning flags as --flag=value; "
                f"allowed: {', '.join(TUNING_FLAGS)} (e.g. --grpc-infer-allocation-pool-size=256)"
            )


def check_quantiles(text: str) -> None:
    """Raises ConfigError for a pair of text ("q:error,q:error") that is not two numbers strictly between 0 and
    1. Checked here, because tritonserver logs a bad pair and goes on without it: a typo would silently drop the
    p99 the alert rules read."""
    for pair in text.split(","):
        quantile, _, error = pair.partition(":")
        try:
            ok = 0 < float(quantile) < 1 and 0 < float(error) < 1
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(
                f"LATENCY_QUANTILES={text!r}: {pair!r} is not 'quantile:error' with both between 0 and 1; "
                f"for example {DEFAULT_QUANTILES!r}"
            )


@dataclass(frozen=True, kw_only=True)
class TritonTuning:
    """tritonserver's own knobs, checked when the record is made (before anything starts).

    args: tuning flags, each one of TUNING_FLAGS as --flag=value (`make serve SERVER_ARGS="..."`): pools and
        thread counts only.
    latency_summaries: whether tritonserver keeps p50/p90/p99 summaries per model (`LATENCY_SUMMARIES=0`: off;
        2.51 has summaries, not histograms). They cost a server thread per request: five summaries updated under
        the model's statistics lock, each over five age buckets; counters and the statistics API stay either way.
    latency_quantiles: the quantiles they keep, "q:error,..." (`LATENCY_QUANTILES=`). Triton's five default
        quantiles cost twice what our three do (23 against 11 us a request on a 2-core host, 60 against 31 us at
        20,000 requests/s: docs/cpu/latency_quantiles_2core.md).
    """

    args: tuple[str, ...] = ()
    latency_summaries: bool = True
    latency_quantiles: str = DEFAULT_QUANTILES

    def __post_init__(self):
        check_tuning_args(self.args)
        if self.latency_summaries:
            check_quantiles(self.latency_quantiles)

    def flags(self) -> list[str]:
        """Its part of the tritonserver command line."""
        summaries = [f"--metrics-config=summary_latencies={str(self.latency_summaries).lower()}"]
        if self.latency_summaries:
            summaries.append(f"--metrics-config=summary_quantiles={self.latency_quantiles}")
        return [*summaries, *self.args]

    def cli_args(self) -> list[str]:
        """The same settings as `python -m tpserve.server supervise` options (what the supervisor is started with)."""
        summaries = "--latency-summaries" if self.latency_summaries else "--no-latency-summaries"
        return ["--server-args", " ".join(self.args), summaries, "--latency-quantiles", self.latency_quantiles]

    @classmethod
    def parse(cls, args: str = "", summaries: bool = True, quantiles: str = "") -> TritonTuning:
        """From the command line's words (SERVER_ARGS, LATENCY_SUMMARIES, LATENCY_QUANTILES).

        Raises:
            ConfigError: a flag or quantile that tritonserver would not take as meant.
        """
        return cls(
            args=tuple(args.split()), latency_summaries=summaries, latency_quantiles=quantiles or DEFAULT_QUANTILES
        )


@dataclass(frozen=True)
class ServerSettings:
    """How to run the server. Ports bind to host (127.0.0.1 unless told otherwise)."""

    repo: Path
    _: KW_ONLY
    http_port: int = HTTP_PORT
    grpc_port: int = GRPC_PORT
    metrics_port: int = METRICS_PORT
    host: str = "127.0.0.1"
    state_dir: Path = STATE_DIR
    startup_timeout: float = 180.0
    model_control: str = "none"
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    tuning: TritonTuning = TritonTuning()
    ragged_stats: Path | None = None  # where ragged models write their per-batch statistics (text-bench reads them)
    # ports behind the edge ("http", "grpc", "metrics"): only processes of this user connect (Envoy, the
    # supervisor); gRPC's stream resets are never seen as cancellations there (server/triton/front/h2_reading.c)
    internal: tuple[str, ...] = ()
    # the edge's cancelled-calls table (server/edge/cancel_table.py): calls get their id as a parameter, models skip
    # the cancelled ones; None: no edge, nothing skipped
    cancelled_calls: Path | None = None
    backlog_slot: int = 0  # this server's slot of the edge's backlog file (a replica's index)
    # admission by queue time (supervision/admission_control.py): the edge's admission table and the budgets
    # ("20" or "model=20 *=50"); the supervisor marks this server's region (backlog_slot) of it. None: no admission
    admission_table: Path | None = None
    queue_budgets: str = ""
    # the edge's HTTP checks inside tritonserver's reads (server/triton/front/http_front.c): its rules file (0600,
    # request_checks.checks_json) and "max_body_bytes,max_head_bytes,max_connections"; None: not checked there
    http_checks: Path | None = None
    http_check_limits: str = ""
    # with the checks in the server: the calls it may run before new ones are refused at once (the edge's waiting
    # bound, server/edge/admission.py; front/bounds.c); 0: no bound
    max_waiting: int = 0
    # with the checks in the server: ModelStreamInfer served on the public gRPC port (off: each stream refused,
    # UNIMPLEMENTED, before its first message reaches gRPC; tritonserver 2.51 crashes under concurrent streams)
    grpc_streaming: bool = False

    def __post_init__(self):
        unknown = set(self.internal) - set(INTERNAL_PORTS)
        if unknown:
            raise ConfigError(f"internal ports {sorted(unknown)}: expected some of {', '.join(INTERNAL_PORTS)}")

    def guard_environment(self) -> dict[str, str]:
        """What tells the guard (server/triton/front/own_ports.c) which ports are the edge's and which speak gRPC
        there."""
        ports = {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}
        own = ",".join(str(ports[name]) for name in self.internal)
        h2 = str(self.grpc_port) if "grpc" in self.internal else ""
        found = {"TRITON_GUARD_OWN_PORTS": own, "TRITON_GUARD_H2_PORTS": h2}
        if self.http_checks is not None:  # the edge's checks in the server: clients reach both ports directly
            found.update(
                TRITON_GUARD_FRONT_HTTP=str(self.http_port),
                TRITON_GUARD_RULES=str(self.http_checks),
                TRITON_GUARD_FRONT_LIMITS=self.http_check_limits,
                TRITON_GUARD_H2_PORTS=",".join(filter(None, (h2, str(self.grpc_port)))),
                TRITON_GUARD_H2_PUBLIC=str(self.grpc_port),
                TRITON_GUARD_MAX_WAITING=str(self.max_waiting),
                TRITON_GUARD_ADMISSION=str(self.admission_table or ""),
                TRITON_GUARD_STREAMING="1" if self.grpc_streaming else "0",
            )
        return found


def private_state(state_dir: Path) -> Path:
    """state_dir created with mode 0700 or, when it is ours already, closed to others (chmod 700): its logs,
    records, sockets and key are then this user's alone, whatever the caller's umask.

    Raises:
        ServerError: the folder is a link, not a folder, or another user's.
    """
    path = Path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    if not path.is_symlink() and path.is_dir() and path.stat().st_uid == os.geteuid():
        path.chmod(0o700)
    try:
        return check_private(path)
    except UnsafeFolderError as err:
        raise ServerError(f"state folder: {err}") from None


def admin_key(state_dir: Path) -> Path:
    """The admin key file of a state folder, created (mode 600) on first use."""
    path = state_dir / "admin_key"
    if not path.exists():
        private_state(state_dir)
        write_key(path)
    return path


def write_key(path: Path) -> Path:
    """A new admin key in path (mode 600; never over an existing file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(24) + "\n")
    return path


def check_ports_free(settings: ServerSettings) -> None:
    """Raise ServerError naming the first port that something else already holds."""
    for label, port in (("http", settings.http_port), ("grpc", settings.grpc_port), ("metrics", settings.metrics_port)):
        check_port_free(settings.host, label, port)


def check_port_free(host: str, label: str, port: int) -> None:
    """Raise ServerError when something holds host:port (TIME_WAIT is no holder, as for servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise ServerError(
                f"{label} port {port} on {host} is in use ({err.strerror}); stop what holds it "
                f"(`make stop` if it is our server) or choose another port (e.g. {label.upper()}_PORT=...)"
            ) from None


def server_command(settings: ServerSettings, binary: Path, backends: Path, key: str) -> list[str]:
    """The tritonserver command line."""
    restricted = f"{','.join(RESTRICTED)}:{ADMIN_HEADER}={key}"
    return [
        str(binary),
        f"--model-repository={settings.repo.resolve()}",
        f"--backend-directory={backends.resolve()}",
        f"--model-control-mode={settings.model_control}",
        f"--http-address={settings.host}",
        f"--http-port={settings.http_port}",
        f"--grpc-address={settings.host}",
        f"--grpc-port={settings.grpc_port}",
        f"--metrics-address={settings.host}",
        f"--metrics-port={settings.metrics_port}",
        f"--http-restricted-api={restricted}",
        f"--grpc-restricted-protocol={restricted}",
        "--strict-readiness=true",
        "--exit-on-error=false",
        "--log-verbose=0",
        "--exit-timeout-secs=10",
        *settings.tuning.flags(),
        *(cancel_table.server_flags() if settings.cancelled_calls else []),
        *settings.extra_args,
    ]


def start(settings: ServerSettings) -> ServerState:
    """Start tritonserver in its own session and return once it is ready.

    Raises:
        ServerError: binary missing, repository missing, port in use, a model failed to
            load (which and why), or the server did not get ready in time.
    """
    if not (settings.repo / "manifest.json").exists() and not any(settings.repo.glob("*/config.pbtxt")):
        raise ServerError(f"no model repository at {settings.repo}: build one first (`make build-engines`)")
    refuse_running(settings.state_dir)
    _guard_plans(settings.repo)
    check_ports_free(settings)
    left_out = {**numpy_left_out(settings.repo), **built_before_tpserve(settings.repo)}
    if left_out:
        settings = _loading_only(settings, left_out)
    install = find_install()
    private_state(settings.state_dir)
    key_file = admin_key(settings.state_dir)
    backends = prepare_backends(install, settings.state_dir)
    if uses_inprocess(settings.repo):
        build_inprocess(backends)
    command = server_command(settings, install.binary, backends, PLACEHOLDER)  # the key goes through a pipe
    command += [f"--cache-directory={install.caches}", f"--cache-config=local,size={CACHE_BYTES}"]
    log = settings.state_dir / "tritonserver.log"
    try:
        env = {**server_environment(install), **kernel_cache_env(settings.state_dir)}  # kernels: never /tmp's
        env.update(settings.guard_environment())
        if settings.cancelled_calls:
            env.update(cancel_table.server_environment(settings.cancelled_calls, settings.backlog_slot))
        if settings.ragged_stats is not None:
            env["TRITON_RAGGED_STATS"] = str(settings.ragged_stats)  # triton_models.ragged_runner.STATS_VARIABLE
    except UnsafeFolderError as err:
        raise ServerError(str(err)) from None
    env, secret_fd = pass_secret(env, key_file.read_text().strip())
    try:
        with open(log, "a") as handle:  # appended, never truncated: a crash's evidence survives the restart
            handle.write(f"\n{START_MARK} {time.strftime('%Y-%m-%dT%H:%M:%S%z')} =====\n")
            handle.flush()
            process = subprocess.Popen(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                umask=0o077,
                pass_fds=(secret_fd,),
                start_new_session=True,
            )
    finally:
        os.close(secret_fd)
    CHILDREN[process.pid] = process
    state = ServerState(
        pid=process.pid,
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        metrics_port=settings.metrics_port,
        repo=str(settings.repo.resolve()),
        log=str(log.resolve()),
        admin_key_file=str(key_file.resolve()),
        left_out=left_out,
    )
    write_state(settings.state_dir, state)
    try:
        wait_ready(state, process, settings.startup_timeout)
        check_admin_key(state)
    except BaseException:
        stop(settings.state_dir)
        raise
    remember_regions(settings.state_dir, regions_of(state.pid))  # what a crash would leave behind
    return state


@contextlib.contextmanager
def running(repo: Path, state_dir: Path, **options) -> Iterator[ServerState]:
    """A server on free 127.0.0.1 ports for the length of a with block: started, yielded, always stopped.

    options: the other ServerSettings fields (model_control, startup_timeout, extra_args, ...)."""
    http, grpc, metrics = free_ports(3)
    settings = ServerSettings(
        repo, http_port=http, grpc_port=grpc, metrics_port=metrics, state_dir=state_dir, **options
    )
    state = start(settings)
    try:
        yield state
    finally:
        stop(state_dir)


def check_admin_key(state: ServerState) -> None:
    """The admin API opens with the key and stays shut with the command line's placeholder.

    Raises:
        ServerError: the key did not reach the server (the shim did not run); the server must not serve.
    """
    import urllib.error
    import urllib.request

    def status(key: str) -> int:
        request = urllib.request.Request(
            f"http://{state.http_url}/v2/repository/index", data=b"{}", method="POST", headers={ADMIN_HEADER: key}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as err:
            return err.code

    real, placeholder = status(Path(state.admin_key_file).read_text().strip()), status(PLACEHOLDER)
    if real != 200 or placeholder == 200:
        raise ServerError(
            f"the admin key did not reach tritonserver (key: {real}, placeholder: {placeholder}); "
            "rebuild the shim with `make install` (server/triton/triton_shim.c)"
        )


NUMPY_WHY = (
    "numpy {version} is installed, but the embedded tritonserver's Python-backend stub was built for numpy 1: its "
    "outputs made from numpy arrays would reach clients empty (the stubs' own environment with numpy 1 serves it: "
    "the bundle's install.sh prints TPSERVE_STUB_PYTHON; or pip install numpy==1.26.4)"
)


def supervisor_of(state_dir: Path) -> int | None:
    """The pid of the supervisor recorded in state_dir where it still runs (and is not this process); None
    otherwise. A supervisor outlives its tritonserver: it restarts it."""
    from tpserve.server.triton.processes import supervises

    try:
        pid = json.loads((Path(state_dir) / SUPERVISOR_STATE).read_text() or "{}").get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid() or not supervises(pid, state_dir):
        return None
    return pid


def running_from(state_dir: Path) -> str | None:
    """What still runs of a server started from state_dir (its supervisor, its tritonserver, or a replica's),
    said in a few words; None where nothing does."""
    from tpserve.server.triton.processes import alive, is_tritonserver

    for folder in (Path(state_dir), *sorted(Path(state_dir).glob("replica-*"))):
        supervisor = supervisor_of(folder)
        if supervisor:
            return f"its supervisor, pid {supervisor}"
        try:
            state = read_state(folder)
        except ServerError:
            continue
        if state.pid and alive(state.pid) and is_tritonserver(state.pid):
            return f"tritonserver pid {state.pid} (http {state.http_url}, grpc {state.grpc_url})"
    return None


def refuse_running(state_dir: Path) -> None:
    """Raises ServerError where a server started from state_dir still runs: a second one would overwrite its
    records, and `make stop` would then stop only one of them."""
    running = running_from(state_dir)
    if running:
        raise ServerError(
            f"a server started from {state_dir} is running ({running}): stop it first (`make stop "
            f"STATE_DIR={state_dir}`), or give this one another STATE_DIR"
        )


def numpy_left_out(repo: Path, version: str | None = None) -> dict[str, str]:
    """The repository's models this environment's numpy cannot serve, each with why, and the ensembles that
    call one of them (they could not load either); {} under numpy 1."""
    if version is None:
        from tpserve.server.triton.installed import stub_numpy

        version = stub_numpy()  # the stubs' environment (TPSERVE_STUB_PYTHON), which may not be this one
    if int(version.split(".")[0]) < 2:
        return {}
    why = NUMPY_WHY.format(version=version)
    left = {p.parent.name: why for p in repo.glob("*/config.pbtxt") if _answers_with_numpy(p)}
    steps = ensemble_steps(repo)
    grew = True
    while grew:  # an ensemble of an ensemble that lost a step loses it too
        callers = {e: f"calls {s}, which is not served" for e, used in steps.items() for s in used if s in left}
        grew = bool(set(callers) - set(left))
        left = {**callers, **left}
    return dict(sorted(left.items()))


STALE_WHY = (
    "built before the project became one package (tpserve): its model.py imports triton_models, which is "
    "tpserve.triton_models now; rebuild it (`make build-engines` or `tpserve build`)"
)


def built_before_tpserve(repo: Path) -> dict[str, str]:
    """The repository's models whose model.py was copied before the rename, each with why (they cannot load)."""
    import re

    old = re.compile(r"^\s*(from|import) triton_models\b", re.M)
    return {
        path.parents[1].name: STALE_WHY
        for path in sorted(repo.glob("*/*/model.py"))
        if old.search(path.read_text(errors="replace"))
    }


def ensemble_steps(repo: Path) -> dict[str, list[str]]:
    """Per ensemble of the repository, the models its steps call (from config.pbtxt, as Triton reads it)."""
    from tpserve.builders.repository.model_config import repository_configs

    found = ((n, c.ensemble_scheduling.step) for n, c in repository_configs(repo) if c.platform == "ensemble")
    return {name: [s.model_name for s in used] for name, used in found}


def _loading_only(settings: ServerSettings, left_out: dict[str, str]) -> ServerSettings:
    """settings that load every model of the repository but those left out (explicit model control).

    Raises:
        ServerError: nothing would be left to serve.
    """
    import dataclasses

    served = sorted(p.parent.name for p in settings.repo.glob("*/config.pbtxt") if p.parent.name not in left_out)
    if not served:
        detail = "; ".join(f"{m}: {why}" for m, why in left_out.items())
        raise ServerError(f"no model of {settings.repo} can be served here: {detail}")
    kept = tuple(a for a in settings.extra_args if not a.startswith("--load-model"))
    loads = tuple(f"--load-model={m}" for m in served)
    return dataclasses.replace(settings, model_control="explicit", extra_args=(*kept, *loads))


def numpy_problem(repo: Path, version: str | None = None, models: list[str] | None = None) -> str | None:
    """Why this environment's numpy cannot serve the repository's Python-backend models, or None.

    The embedded tritonserver's Python-backend stub was built for numpy 1. Under numpy 2 (measured
    with 2.5.2 on the GPU host) every output a model made from a numpy array reached clients empty,
    while torch tensors passed through DLPack intact. So numpy 2 is refused for models that answer
    with numpy arrays (the pipelines' numpy steps; ONNX Runtime models written before theirs crossed through DLPack,
    or with BYTES or BOOL tensors), rather than served wrongly.
    """
    if version is None:
        from tpserve.server.triton.installed import stub_numpy

        version = stub_numpy()
    if int(version.split(".")[0]) < 2:
        return None
    configs = [p for p in repo.glob("*/config.pbtxt") if models is None or p.parent.name in models]
    affected = sorted(p.parent.name for p in configs if _answers_with_numpy(p))
    if not affected:
        return None
    return (
        f"numpy {version} is installed, but the embedded tritonserver's Python-backend stub was built for numpy 1: "
        f"outputs made from numpy arrays reach clients empty, so {', '.join(affected)} would answer wrongly. "
        "Install numpy==1.26.4 in this environment (pip install numpy==1.26.4), serve only torch-runtime variants, or "
        "rebuild: ONNX Runtime models of numbers only are written to hand their tensors over through DLPack."
    )


def _answers_with_numpy(path: Path) -> bool:
    """A Python-backend model other than the torch runtime and the steps marked dlpack_outputs (their outputs
    leave through DLPack)."""
    from tpserve.builders.repository.model_config import parse_pbtxt
    from tpserve.builders.repository.writer import is_torch_runtime

    config = parse_pbtxt(path.read_text())
    dlpack = "dlpack_outputs" in config.parameters and config.parameters["dlpack_outputs"].string_value == "1"
    return config.backend == "python" and not is_torch_runtime(config) and not dlpack


def _guard_plans(repo: Path) -> None:
    from tpserve.builders.repository.manifest import read_manifest

    guard_manifest(read_manifest(repo))


def guard_manifest(manifest: dict) -> None:
    """The embedded server has no TensorRT backend: refuse plans up front, naming them; and compiled
    engines built for another torch, triton or GPU than this host's."""
    from tpserve.builders.checks.guard import check_manifest, local_target

    where = "the embedded tritonserver (Python backend only) on this host"
    check_manifest(manifest, local_target(tensorrt=False, where=where))


def _log_tail(state: ServerState, lines: int = 15) -> str:
    try:
        return "\n".join(Path(state.log).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


START_MARK = "===== tritonserver starting"  # each start's first line in the log, which is appended to
LOADING = re.compile(r'"loading: ([^:"]+):\d+"')
LOADED = re.compile(r"successfully loaded '([^']+)'")


def _crash_cause(state: ServerState, code: int | None) -> str:
    """Where a signal ended tritonserver while it loaded models: the models it was loading (the log since this
    start), and for those with a model_warmup, tritonserver 2.51's crash on a warmup request its model refuses."""
    if code is None or code >= 0:
        return ""
    try:
        text = Path(state.log).read_text(errors="replace").rsplit(START_MARK, 1)[-1]
    except OSError:
        return ""
    loading = [m for m in dict.fromkeys(LOADING.findall(text)) if m not in set(LOADED.findall(text))]
    if not loading:
        return f" (signal {-code})"
    warmed = [m for m in loading if "model_warmup" in _config_text(Path(state.repo) / m)]
    said = f" (signal {-code}) while loading {', '.join(loading)}"
    if warmed:
        said += (
            f": {', '.join(warmed)} warm(s) up at load, and tritonserver 2.51 crashes when a model answers a warmup "
            "request with an error (random_data holds NaN, infinities and values far outside any range a model "
            "may check): give those inputs zero_data or input_data_file in model_warmup, or remove it"
        )
    return said


def _config_text(folder: Path) -> str:
    try:
        return (folder / "config.pbtxt").read_text(errors="replace")
    except OSError:
        return ""


def wait_ready(state: ServerState, process: subprocess.Popen, timeout: float) -> None:
    """Poll until the server is ready; fail fast on exit or on a model that failed to load."""
    import tritonclient.http as http

    # Closed on return: an open keep-alive connection holds up the server's exit by its exit timeout.
    with http.InferenceServerClient(state.http_url) as client:
        _poll_ready(client, state, process, timeout)


def _poll_ready(client, state: ServerState, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(
                f"tritonserver exited with code {process.returncode}{_crash_cause(state, process.returncode)}; "
                f"log {state.log}:\n{_log_tail(state)}"
            )
        if _is(client.is_server_ready):
            return
        if _is(client.is_server_live):
            _raise_on_failed_models(client, state)
        time.sleep(0.25)
    raise ServerError(f"tritonserver not ready after {timeout:.0f} s; log {state.log}:\n{_log_tail(state)}")


def _is(probe) -> bool:
    try:
        return bool(probe())
    except Exception:  # connection refused while starting
        return False


def failed_models(client, state: ServerState) -> list[tuple[str, str]]:
    """(model, reason) for every model of the repository index that failed to load."""
    index = client.get_model_repository_index(headers=state.admin_headers())
    failed = [m for m in index if m.get("state") == "UNAVAILABLE" and m["name"] not in state.left_out]
    return [(m["name"], m.get("reason", "")) for m in failed]


def _raise_on_failed_models(client, state: ServerState) -> None:
    try:
        failed = failed_models(client, state)
    except Exception:
        return
    if failed:
        detail = "; ".join(f"{name}: {reason or 'no reason given'}" for name, reason in failed)
        raise ServerError(f"model(s) failed to load: {detail} (log {state.log}); fix or rebuild them and retry")


def stop(state_dir: Path, timeout: float = 30.0) -> bool:
    """Stop the server started from state_dir; return whether one was running."""
    try:
        state = read_state(state_dir)
    except ServerError:
        return False
    running = is_tritonserver(state.pid)
    regions = regions_of(state.pid) if running else set()  # its own regions: others' stay, even this user's
    if running:
        terminate_group(state.pid, timeout)
    end_orphaned_stubs(state.pid)  # a crashed server's, or those that outlived a stop
    CHILDREN.pop(state.pid, None)
    (state_dir / STATE).unlink(missing_ok=True)
    remove_regions(state_dir, regions)
    return running
