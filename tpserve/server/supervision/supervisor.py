"""Self-healing for the embedded server: reload models whose stub died, restart a crashed tritonserver.

The supervisor runs tritonserver in explicit model-control mode with every model loaded at start
(so it may reload one through the model-control API) and, every `interval` seconds:
- restarts tritonserver on the same repository and ports when its process is gone;
- reloads a model that stopped answering: every `probes.interval` one small inference per model,
  and `probes.threshold` timeouts or server errors in a row trigger a reload (server/supervision/probes.py);
- reloads a model when one of its Python-backend stub processes is gone (Triton keeps saying the
  model is ready while every request fails with "Stub process ... is not healthy"), except the
  models a rollout holds (server/supervision/rollout_lock.py).
A reload that fails is tried again with backoff (RetrySettings: 1 s, doubling up to 30 s) until it works.
It answers load balancers truthfully on its own port and on a private Unix socket (Envoy's):
GET /v2/health/ready: 200 while the server is up and answering, whatever one model's state (the body names
the models being healed or broken); GET /v2/models/<name>/ready: 200 only while the model is loaded, not
being healed or broken, and, for an ensemble, every step is ready too; GET /status (JSON).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from tpserve.common import endpoints
from tpserve.common.errors import ServerError
from tpserve.server.supervision.health_server import HealthServer
from tpserve.server.supervision.liveness import (
    DEFAULT_LIVENESS,
    LivenessSettings,
    Misses,
    crash_cause,
    describe_exit,
    live,
    log_tail,
    reap,
)
from tpserve.server.supervision.probes import (
    DEFAULT_PROBES,
    ProbeSettings,
    ProbeState,
    answered,
    busy,
    probe_inputs,
    record,
    work_done,
)
from tpserve.server.supervision.rollout_lock import paused_models
from tpserve.server.triton import launcher
from tpserve.server.triton.processes import (
    STUB,
    cmdline,
    end_orphaned_stubs,
    is_tritonserver,
    regions_of,
    remember_regions,
    remove_regions,
    stub_pids,
    terminate_group,
)

STATE = launcher.SUPERVISOR_STATE
HEALTH_SOCKET = "health.sock"  # readiness for Envoy, mode 0600
KEEP_EVENTS, KEEP_RESTARTS = 200, 20  # what /status and memory hold; the log keeps everything, with its time
LOG = logging.getLogger("supervisor")


@dataclasses.dataclass(frozen=True)
class RetrySettings:
    """A failed reload is tried again after first_s, then twice as long each time, up to max_s."""

    first_s: float = 1.0
    max_s: float = 30.0

    def wait(self, attempts: int) -> float:
        """Seconds before the next try, after `attempts` failed ones."""
        return min(self.first_s * 2 ** (attempts - 1), self.max_s)


DEFAULT_RETRY = RetrySettings()


def _bounded(keep: int):
    return dataclasses.field(default_factory=lambda: collections.deque(maxlen=keep))


@dataclasses.dataclass
class Health:
    """What the supervisor knows, shared with its HTTP endpoint."""

    server_up: bool = False
    live: bool = True  # the server answered its last liveness checks
    healing: set = dataclasses.field(default_factory=set)  # models being reloaded
    unloaded: set = dataclasses.field(default_factory=set)  # unloaded through the API: not healed until loaded
    restarts: collections.deque = _bounded(KEEP_RESTARTS)  # the last restarts: time, pid, exit, reason, log tail
    models: set = dataclasses.field(default_factory=set)
    broken: dict = dataclasses.field(default_factory=dict)  # model -> {reason, attempts, retry_at}: reload failed
    steps: dict = dataclasses.field(default_factory=dict)  # ensemble -> the models it calls
    events: collections.deque = _bounded(KEEP_EVENTS)  # (time, what) of the last heals and restarts
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # events, restarts: all
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def record(self, what: str, level: int = logging.INFO) -> None:
        """An event: kept in /status (the last KEEP_EVENTS), counted, and logged with its level and time."""
        with self.lock:
            self.events.append((round(time.time(), 3), what))
            self.counts["events"] += 1
        LOG.log(level, what)

    def ready(self, model: str | None = None) -> bool:
        """The server (model None): up and answering. A model: loaded, not healing or broken, its steps ready."""
        with self.lock:
            if model is None:
                return self.server_up and self.live
            return self.server_up and self.live and self._model_ready(model, depth=0)

    def _model_ready(self, model: str, depth: int) -> bool:
        if model not in self.models or model in self.healing or model in self.broken or depth > 8:
            return False
        return all(self._model_ready(step, depth + 1) for step in self.steps.get(model, ()))

    def not_ready(self) -> dict:
        """Models that cannot serve now, with why (healing, broken, a step of an ensemble)."""
        with self.lock:
            found = {m: "being healed" for m in self.healing}
            found |= {m: f"broken: {b['reason']}" for m, b in self.broken.items()}
            for ensemble, steps in self.steps.items():
                missing = [s for s in steps if s not in self.models or s in found]
                if missing and ensemble in self.models:
                    found[ensemble] = f"step(s) not ready: {', '.join(missing)}"
            return found

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "server_up": self.server_up,
                "live": self.live,
                "broken": dict(self.broken),
                "healing": sorted(self.healing),
                "models": sorted(self.models),
                "unloaded": sorted(self.unloaded),
                "events": list(self.events),
                "restarts": list(self.restarts),
                "events_total": self.counts["events"],
                "restarts_total": self.counts["restarts"],
            }


class Supervisor:
    """Runs one tritonserver and heals it; stop() ends both."""

    def __init__(
        self,
        settings: launcher.ServerSettings,
        health_port: int,
        interval: float = 0.5,
        drain: float = 0.0,
        probes: ProbeSettings = DEFAULT_PROBES,
        liveness: LivenessSettings = DEFAULT_LIVENESS,
        retry: RetrySettings = DEFAULT_RETRY,
    ):
        extra = tuple(a for a in settings.extra_args if not a.startswith("--load-model"))
        self.settings = dataclasses.replace(settings, model_control="explicit", extra_args=(*extra, "--load-model=*"))
        self.health, self.interval, self.stopping = Health(), interval, threading.Event()
        self.drain = drain  # seconds of "not ready" before the server stops: load balancers route away first
        socket_path = settings.state_dir / HEALTH_SOCKET
        self.admission: Any = None  # admission_control.Controller, where the edge admits by queue time
        answer, key = _answer(self.health, self._metrics), launcher.admin_key(settings.state_dir)
        self.http = HealthServer(settings.host, health_port, answer, socket_path, key_file=key)
        self.liveness, self.misses, self.kill_reason = liveness, Misses(), ""
        self.state: endpoints.ServerState | None = None
        self.stubs: dict[str, set[int]] = {}
        self.paused: set[str] = set()  # models a rollout held in the last round
        self.probes, self.probed, self.retry = probes, ProbeState(), retry
        self.reloading = threading.RLock()  # one reload at a time (stub watch and probes)
        self.recorded_stubs: frozenset[int] = frozenset()  # the stubs whose regions remember_regions holds

    @property
    def server(self) -> endpoints.ServerState:
        """The running tritonserver's state: set by _start_server, before any loop runs."""
        assert self.state is not None, "the supervisor's server has not started"
        return self.state

    def start(self) -> None:
        launcher.private_state(self.settings.state_dir)
        self.http.start()
        remove_regions(self.settings.state_dir)  # regions an earlier crash of this server left behind
        self._start_server()
        if self.probes.interval > 0:
            threading.Thread(target=self._probe_loop, daemon=True).start()
        threading.Thread(target=self._liveness_loop, daemon=True).start()
        threading.Thread(target=self._retry_loop, daemon=True).start()
        self._start_admission()

    def _start_admission(self) -> None:
        """Admission by queue time (supervision/admission_control.py), where the edge has a table and budgets."""
        from tpserve.server.supervision import admission_control

        budgets = admission_control.QueueBudgets.parse(self.settings.queue_budgets)
        if self.settings.admission_table is None or not budgets.enabled:
            return
        url = f"http://{self.settings.host}:{self.settings.metrics_port}/metrics"
        table, region = self.settings.admission_table, self.settings.backlog_slot
        self.admission = admission_control.start(budgets, table, region, url, self.stopping)

    def _metrics(self) -> str:
        """GET /metrics: what admission control measured and refused (empty without it)."""
        return self.admission.prometheus() if self.admission is not None else ""

    def _liveness_loop(self) -> None:
        """Every liveness.interval: is the server answering? Not ready after a miss, killed after several."""
        while not self.stopping.wait(self.liveness.interval):
            with self.health.lock:
                if not self.health.server_up:
                    continue
            state = self.server
            ok = live(state.http_url, self.liveness.timeout)
            misses = self.misses.add(ok)
            with self.health.lock:
                self.health.live = misses < self.liveness.not_ready_after
            if misses == self.liveness.not_ready_after:
                self.health.record(
                    f"tritonserver (pid {state.pid}) did not answer /v2/health/live; not ready", logging.WARNING
                )
            if self.liveness.kill_after and misses >= self.liveness.kill_after:
                self._kill_frozen(state, misses)

    def _kill_frozen(self, state: endpoints.ServerState, misses: int) -> None:
        waited = misses * (self.liveness.interval + self.liveness.timeout)
        self.kill_reason = f"frozen: no answer to {misses} liveness checks (about {waited:.1f} s)"
        self.health.record(f"tritonserver (pid {state.pid}) {self.kill_reason}; killing it to restart", logging.WARNING)
        self.misses.count = 0
        try:
            os.killpg(state.pid, signal.SIGKILL)  # SIGKILL ends a stopped process too
        except ProcessLookupError:
            pass

    def _probe_loop(self) -> None:
        """Every probes.interval: one probe per model, all at once (a round takes at most about one probe
        timeout, whatever the number of models); reload a model after probes.threshold failures in a row."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="probe") as pool:
            while not self.stopping.wait(self.probes.interval):
                with self.health.lock:
                    if not self.health.server_up:
                        continue
                    models = sorted(self.health.models - self.health.healing - self.paused - set(self.health.broken))
                targets = [(m, inputs) for m in models if (inputs := self._probe_inputs(m))]
                urls = [self.server.http_url] * len(targets)
                results = pool.map(self._probe_one, urls, targets)
                for model, ok in list(results):
                    if record(self.probed, model, ok, self.probes.threshold) and not self.stopping.is_set():
                        self._reload(model, f"{self.probes.threshold} probes in a row got no answer")

    def _probe_one(self, url: str, target: tuple) -> tuple[str, bool]:
        """A model answers its probe, or else it counts as alive while it runs batches (busy, not hung)."""
        model, inputs = target
        ok = answered(url, model, inputs, self.probes.timeout)
        done = work_done(url, model, self.probes.timeout, self.server.admin_headers())
        return model, busy(self.probed, model, done) or ok

    def _probe_inputs(self, model: str):
        """Probe inputs of a model (None: not probed, e.g. ensembles: their steps are; []: ask again later)."""
        if model not in self.probed.inputs:
            import tritonclient.http as http

            try:
                with http.InferenceServerClient(self.server.http_url, network_timeout=self.probes.timeout) as client:
                    metadata, config = client.get_model_metadata(model), client.get_model_config(model)
            except Exception:  # not answering: probe it next round
                return []
            self.probed.inputs[model] = None if config.get("platform") == "ensemble" else probe_inputs(metadata, config)
        return self.probed.inputs[model]

    def _start_server(self) -> None:
        self.state = state = launcher.start(self.settings)
        self.stubs = stub_pids(state.pid, self.settings.repo)
        self.misses.count = 0
        steps = launcher.ensemble_steps(self.settings.repo)
        loaded = set(self._loaded())
        with self.health.lock:
            self.health.server_up, self.health.live, self.health.models = True, True, loaded
            self.health.unloaded.clear()
            self.health.steps = steps
            # Marks against the dead server are stale: this one loaded its models itself. Retrying them would
            # unload a healthy model (a reload is an unload and a load) and fail requests for seconds.
            for model in loaded:
                self.health.broken.pop(model, None)
                self.health.healing.discard(model)

    def _loaded(self) -> list[str]:
        found = self._index().items()  # models of the repository only: a name like ".." is no folder of it
        return [
            n
            for n, e in found
            if e.get("state") == "READY" and not set(n) <= {"."} and (self.settings.repo / n).is_dir()
        ]

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.check()

    def check(self) -> None:
        """One round: restart a dead server, else reload models that lost a stub."""
        if not is_tritonserver(self.server.pid):
            self._restart()
            return
        if self.reloading.acquire(blocking=False):  # a reload under way changes the stubs: look next round
            try:
                self._check_stubs()
            finally:
                self.reloading.release()
        self._record_regions()

    def _record_regions(self) -> None:
        """Record the server's shared-memory regions (to clean up after a crash) when its stubs changed:
        regions come and go with stubs, so an unchanged set of stubs needs no look at /proc."""
        seen = frozenset(pid for pids in self.stubs.values() for pid in pids)
        if seen != self.recorded_stubs:
            remember_regions(self.settings.state_dir, regions_of(self.server.pid))
            self.recorded_stubs = seen

    def _retry_loop(self) -> None:
        """Reload broken models on their backoff schedule, apart from the rounds (a reload may take minutes)."""
        while not self.stopping.wait(self.interval):
            with self.health.lock:
                up = self.health.server_up
            if up:
                self._retry_broken()

    def _retry_broken(self) -> None:
        """Reload again every broken model whose backoff has passed."""
        now = time.monotonic()
        with self.health.lock:
            due = [m for m, b in self.health.broken.items() if b["retry_at"] <= now]
        for model in due:
            if self.stopping.is_set():
                return
            with self.health.lock:
                mark = self.health.broken.get(model)
            if mark is None:  # cleared meanwhile (a restarted server loaded it): a reload would only unload it
                continue
            self._reload(model, f"retry {mark['attempts']} after a failed reload")

    def _check_stubs(self) -> None:
        current = stub_pids(self.server.pid, self.settings.repo)
        # A rollout swaps stubs on purpose; one more round after it ends takes a fresh snapshot.
        # the lock lies in the server's folder, or in the cluster's above it (make serve, make cluster)
        held = paused_models(self.settings.state_dir) | paused_models(self.settings.state_dir.parent)
        paused, self.paused = self.paused, held
        paused |= self.paused
        with self.health.lock:
            paused |= set(self.health.broken)  # retried on their own schedule (_retry_broken)
        lost = {model: pids - current.get(model, set()) for model, pids in self.stubs.items() if model not in paused}
        lost = {model: gone for model, gone in lost.items() if gone}
        states = self._states(list(lost)) if lost else {}
        for model, gone in lost.items():
            if states.get(model) == "UNAVAILABLE":
                self._respect_unload(model)
            elif states.get(model) in ("LOADING", "UNLOADING"):  # an operator's load or unload in progress
                continue
            else:  # READY with a dead stub (a crash), or the index did not answer
                self._reload(model, f"{len(gone)} stub process(es) gone")
        self._adopt_loaded(current)
        self.stubs = stub_pids(self.server.pid, self.settings.repo) if lost else current
        for model, state in states.items():
            if state == "UNAVAILABLE":
                self.stubs.pop(model, None)

    def _index(self) -> dict[str, dict]:
        """Triton's repository index by model name (of several versions, a READY one)."""
        import tritonclient.http as http

        with http.InferenceServerClient(self.server.http_url, network_timeout=5.0) as client:
            index = client.get_model_repository_index(headers=self.server.admin_headers())
        found: dict[str, dict] = {}
        for entry in index:  # one entry per version: READY wins
            if entry.get("state") == "READY" or entry["name"] not in found:
                found[entry["name"]] = entry
        return found

    def _states(self, models: list[str]) -> dict[str, str]:
        """Triton's state of models whose stubs are gone: a crashed stub leaves its model READY, an unload
        through the API makes it UNAVAILABLE. Empty when the index does not answer (the next round looks again)."""
        try:
            index = self._index()
        except Exception:  # busy or restarting
            return {}
        return {m: index.get(m, {}).get("state", "UNAVAILABLE") for m in models}

    def _respect_unload(self, model: str) -> None:
        self.health.record(f"{model}: unloaded through the admin API; not healed until it is loaded again")
        with self.health.lock:
            self.health.models.discard(model)
            self.health.unloaded.add(model)

    def _adopt_loaded(self, current: dict[str, set[int]]) -> None:
        """Watch again a model that was unloaded on purpose once its stubs are back (it was loaded)."""
        with self.health.lock:
            back = {m for m in self.health.unloaded if current.get(m)}
            self.health.unloaded -= back
            self.health.models |= back
        for model in back:
            self.stubs[model] = current[model]
            self.health.record(f"{model}: loaded again; watched")

    def _restart(self) -> None:
        with self.health.lock:
            self.health.server_up = False
        dead_regions = remember_regions(self.settings.state_dir, set())
        self._record_exit()
        started = time.monotonic()
        while not self.stopping.is_set():
            try:
                self._start_server()
                self.health.record(f"tritonserver restarted in {time.monotonic() - started:.1f} s")
                remove_regions(self.settings.state_dir, dead_regions)  # the dead server's, now unmapped
                return
            except ServerError as err:  # e.g. a port still held by the dying server: try again
                self.health.record(f"restart failed ({str(err).splitlines()[0]}); retrying", logging.WARNING)
                time.sleep(1.0)

    def _record_exit(self) -> None:
        """The exit status or signal, the log's last lines and the time: in /status and the supervisor log."""
        old, reason = self.server, self.kill_reason or "exited on its own"
        self.kill_reason = ""
        exit_text = describe_exit(reap(old.pid))
        orphans = end_orphaned_stubs(old.pid)  # before the new server's stubs start: they would hold memory
        if orphans:
            self.health.record(f"ended {len(orphans)} Python-backend stubs the dead tritonserver left running")
        tail, cause = log_tail(Path(old.log)), crash_cause(Path(old.log))
        with self.health.lock:
            record = {"time": round(time.time(), 3), "pid": old.pid, "exit": exit_text, "reason": reason}
            self.health.restarts.append({**record, "cause": cause, "log_tail": tail})
            self.health.counts["restarts"] += 1
        self.health.record(
            f"tritonserver (pid {old.pid}) is gone: {exit_text} ({reason}); restarting on the same ports; "
            f"cause in its log: {' | '.join(cause) or 'none found'}; its log ends:\n    " + "\n    ".join(tail),
            logging.ERROR,
        )

    def _reload(self, model: str, why: str) -> None:
        with self.reloading:
            self._reload_now(model, why)

    def _reload_now(self, model: str, why: str) -> None:
        import tritonclient.http as http

        with self.health.lock:
            self.health.healing.add(model)
        self.health.record(f"{model}: {why}; reloading", logging.WARNING)
        state = self.server  # the server this reload is for: a restart replaces it
        started, old = time.monotonic(), stub_pids(state.pid, self.settings.repo).get(model, set())
        try:
            with http.InferenceServerClient(state.http_url, network_timeout=120.0) as client:
                # A load of an unchanged, loaded model is a no-op for Triton, even with a dead stub: unload first.
                client.unload_model(model, headers=state.admin_headers())
                client.load_model(model, headers=state.admin_headers())
            # The old instances' surviving stubs may still be exiting: were they in the next snapshot, their
            # exit would read as another crash and trigger a second reload (a second outage). A wedged stub
            # that Triton gave up on never exits: it is ended here.
            _retire(old, timeout=3.0)
            self.stubs[model] = stub_pids(state.pid, self.settings.repo).get(model, set())
            self.health.record(f"{model}: reloaded in {time.monotonic() - started:.2f} s")
        except Exception as err:  # tried again with backoff; this model reads not ready meanwhile
            if self._server_gone(state):  # its stubs died with it: the restart loads every model again
                self._leave_to_restart(model, state)
                return
            if not (self.settings.repo / model).is_dir():
                self._forget(model)
                return
            self._mark_broken(model, str(err).splitlines()[0] if str(err) else type(err).__name__)
            return
        with self.health.lock:
            self.health.healing.discard(model)
            self.health.broken.pop(model, None)
            self.health.models.add(model)

    def _server_gone(self, state: endpoints.ServerState) -> bool:
        return state is not self.state or not is_tritonserver(state.pid)

    def _leave_to_restart(self, model: str, state: endpoints.ServerState) -> None:
        with self.health.lock:
            self.health.healing.discard(model)
        self.health.record(f"{model}: not reloaded, tritonserver (pid {state.pid}) is gone; the restart loads it")

    def _mark_broken(self, model: str, reason: str) -> None:
        self.stubs[model] = set()
        with self.health.lock:
            self.health.healing.discard(model)
            attempts = self.health.broken.get(model, {}).get("attempts", 0) + 1
            wait = self.retry.wait(attempts)
            self.health.broken[model] = {
                "reason": reason[:300],
                "attempts": attempts,
                "retry_at": time.monotonic() + wait,
            }
        self.health.record(f"{model}: reload failed ({reason[:300]}); trying again in {wait:.0f} s", logging.WARNING)

    def _forget(self, model: str) -> None:
        """A model whose folder left the repository is no longer ours to heal."""
        self.health.record(f"{model}: its folder left the repository; no longer watched")
        self.stubs.pop(model, None)
        with self.health.lock:
            self.health.healing.discard(model)
            self.health.broken.pop(model, None)
            self.health.models.discard(model)

    def stop(self) -> None:
        """Answer "not ready" for `drain` seconds (load balancers move away), then stop the server."""
        self.stopping.set()
        with self.health.lock:
            self.health.server_up = False
        LOG.info("stopping: not ready for %.0f s (load balancers move away), then tritonserver stops", self.drain)
        time.sleep(self.drain)
        self.http.shutdown()
        launcher.stop(self.settings.state_dir)
        own = self.state.pid if self.state is not None else 0
        if own and is_tritonserver(own):  # the state file named another server: its own goes too, never orphaned
            terminate_group(own)
        LOG.info("stopped")


def _retire(pids: set[int], timeout: float) -> None:
    """Wait for replaced stubs to exit; SIGKILL those still there after timeout (wedged, abandoned)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(cmdline(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if STUB in cmdline(pid):
            os.kill(pid, signal.SIGKILL)


def _answer(health: Health, metrics=lambda: ""):
    """The readiness endpoint's answers: path -> (status, JSON body; /metrics: Prometheus text)."""

    def answer(path: str) -> tuple[int, dict | str]:
        if path == "/status":
            return 200, health.snapshot()
        if path == "/metrics":
            return 200, metrics()
        if path in ("/v2/health/ready", "/ready"):
            ok = health.ready()
            return (200 if ok else 503), {"ready": ok, "models_not_ready": health.not_ready()}
        parts = path.strip("/").split("/")
        if len(parts) == 4 and parts[:2] == ["v2", "models"] and parts[3] == "ready":
            ok = health.ready(parts[2])
            why = {} if ok else {"why": health.not_ready().get(parts[2], "not loaded, or the server is not up")}
            return (200 if ok else 503), {"model": parts[2], "ready": ok, **why}
        return 404, {"error": f"unknown path {path[:100]}; try /v2/health/ready or /status"}

    return answer


def serve(
    settings: launcher.ServerSettings,
    health_port: int,
    drain: float = 0.0,
    probes: ProbeSettings = DEFAULT_PROBES,
    retry: RetrySettings = DEFAULT_RETRY,
) -> None:
    """Run a supervisor in this process until SIGTERM (it drains first) or SIGINT (it stops at once: nothing
    routes to it any more, or a person pressed Ctrl-C); its state goes to <state_dir>/supervisor.json."""
    supervisor = Supervisor(settings, health_port, drain=drain, probes=probes, retry=retry)
    path = settings.state_dir / STATE
    launcher.private_state(settings.state_dir)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())

    def stop_now(*_) -> None:
        supervisor.drain = 0.0
        supervisor.stopping.set()

    signal.signal(signal.SIGINT, stop_now)
    try:
        supervisor.start()
    except Exception as err:
        path.write_text(json.dumps({"pid": os.getpid(), "error": str(err)}))
        supervisor.http.shutdown()
        raise
    path.write_text(json.dumps({"pid": os.getpid(), "health_port": health_port, "ready": True}))
    try:
        supervisor.run()
    finally:
        supervisor.stop()
        path.unlink(missing_ok=True)
