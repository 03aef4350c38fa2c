"""Zero-downtime rollout of a new build of one model into a running server.

    preflight  nothing changes: the build exists, fits this host, keeps the model's interface
    canary     the build is loaded beside the served model as <model>__candidate and checked through
               the endpoint (smoke request, accuracy gate where the build has labeled data), then unloaded;
               a failure here leaves the serving version untouched ("rejected")
    promote    the build is copied in as the next version folder (one rename), the model-level files
               replaced atomically, and the model loaded: Triton starts the new version while the old
               one serves, then retires the old one (version_policy latest 1), so no request fails
    verify     a smoke request to the new version; on failure the version folder and files are put
               back and the model loaded again ("rolled back")
    record     the manifest gets the build's entry and the model's version history

The server must run in explicit model-control mode (`make serve` does, under its supervisor).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from tpserve.builders.repository.manifest import read_manifest
from tpserve.builders.repository.model_config import parse_pbtxt, proto_to_pbtxt
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.clients.checks import CheckFailed, Gate, accuracy_gate, labeled_data, served_accuracy, smoke
from tpserve.common import endpoints
from tpserve.common.cli import step
from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import ServerError, ToolError
from tpserve.operations.canary import CanaryPlan
from tpserve.server.supervision.rollout_lock import rollout_lock
from tpserve.server.triton import launcher
from tpserve.server.triton import model_versions as mv

CANDIDATE = "{model}__candidate"


class RolloutError(ServerError):
    """A rollout was refused, rejected or rolled back; the version serving before still serves."""


@dataclass(frozen=True, kw_only=True)
class RolloutRequest:
    """Roll the build of `model` in `source` (a repository written by make build-engines) into the server."""

    model: str
    source: Path
    state_dir: Path = Path(".triton")
    canary: bool = True
    gate: Gate = Gate()
    keep: int = 2  # version folders kept on disk (the serving one and the newest retired ones)
    timeout: float = 300.0
    share: CanaryPlan | None = None  # canary by traffic share through the edge (operations/canary.py)
    warm_s: float = 2.0  # a canary by share: the candidate warmed this long on each server before its first step


@dataclass(frozen=True)
class Target:
    """One tritonserver the rollout loads into: its own HTTP endpoint (not the edge) and its pid."""

    name: str
    ep: Endpoint
    pid: int
    metrics_url: str = ""  # its Triton metrics (a canary by traffic share reads them)


@dataclass(kw_only=True)
class Plan:
    """What preflight found: the build, the served model, and every server that serves it."""

    req: RolloutRequest
    targets: list[Target]
    repo: Path
    build_dir: Path  # the build's newest version folder
    files: mv.ModelFiles  # the build's model-level files
    config: Any  # the build's parsed config.pbtxt (a model_config_pb2.ModelConfig)
    entry: dict  # the build's manifest entry
    serving: int  # the version serving now
    served_entry: dict
    checks: dict = field(default_factory=dict)
    candidate_serving: bool = False  # a canary by share: the candidate takes traffic while the build is promoted

    @property
    def ep(self) -> Endpoint:
        """The first server's endpoint: where the canary is loaded and checked."""
        return self.targets[0].ep

    @property
    def model_dir(self) -> Path:
        return self.repo / self.req.model

    @property
    def spec(self) -> ModelSpec | None:
        return ModelSpec.from_dict(self.entry["spec"]) if self.entry.get("spec") else None


def rollout(req: RolloutRequest) -> dict:
    """Roll the build in; return the history event of the new version.

    Raises:
        RolloutError: refused before anything changed, rejected by the canary checks, or rolled back.
    """
    plan = preflight(req)
    candidate = CANDIDATE.format(model=req.model)
    with rollout_lock(req.state_dir, [req.model, candidate]):
        if req.share is not None:
            return _recorded(plan, _by_share(plan, candidate))
        if req.canary:
            try:
                _canary(plan, candidate)
            except CheckFailed as err:
                _refuse(plan, "rejected", err)
        version = _promote(plan)
    return _recorded(plan, version)


def _by_share(plan: Plan, candidate: str) -> int:
    """The candidate loaded and checked, then given its steps of the traffic; promoted past the last one, rolled
    back on a breach. However it ends, the share goes back to 0 and the candidate is unloaded once its requests
    are answered."""
    from tpserve.operations.canary import CanaryBreach, run_steps

    socket, urls = _edge_socket(plan), [t.metrics_url for t in plan.targets]
    folder = plan.repo / candidate
    mv.remove(folder)
    step(f"{plan.req.model}: loading the build beside the serving v{plan.serving} as {candidate}")
    try:
        _write_candidate(plan, candidate, folder)
        for target in plan.targets:
            _load(target.ep, candidate, plan.req.timeout)
        plan.checks = _checks(plan, candidate, "1", accuracy=True)
        plan.checks["warm-up"] = _warm(plan, candidate)
        assert plan.req.share is not None  # _by_share runs for a canary by share only
        plan.checks["steps"] = run_steps(plan.req.share, plan.req.model, candidate, socket, urls)
        plan.candidate_serving = True
        return _promote(plan)
    except (CheckFailed, CanaryBreach) as err:
        plan.checks["steps"] = getattr(err, "steps", plan.checks.get("steps", []))
        failed = err
    finally:
        plan.candidate_serving = False
        _retire_candidate(plan, candidate, socket, folder)
    _refuse(plan, "rolled back" if isinstance(failed, CanaryBreach) else "rejected", CheckFailed(str(failed)))


def _retire_candidate(plan: Plan, candidate: str, socket: Path, folder: Path) -> None:
    from tpserve.operations.canary import set_share

    set_share(socket, plan.req.model, 0)
    time.sleep(1.0)  # requests already routed to the candidate are answered before it goes
    for target in plan.targets:
        _unload(target.ep, candidate)
    mv.remove(folder)
    _await(lambda: not _stale_stubs(plan.targets[0], plan, None), plan.req.timeout)


def _edge_socket(plan: Plan) -> Path:
    from tpserve.server.edge.front import admin_socket
    from tpserve.server.stack import is_stack

    if not is_stack(plan.req.state_dir):
        raise RolloutError(
            "a canary by traffic share needs Envoy in front, which sends the share: serve with `make serve "
            "FRONT=envoy` (`server start --front envoy`) or `make cluster`"
        )
    return admin_socket(plan.req.state_dir)


def _refuse(plan: Plan, status: str, err: CheckFailed) -> NoReturn:
    """Record a rejected or rolled-back build in the history and raise."""
    event = {"version": None, "status": status, "source": str(plan.req.source.resolve()), "reason": str(err)}
    if plan.checks.get("steps"):
        event["steps"] = plan.checks["steps"]
    mv.record(plan.repo, plan.req.model, event)
    raise RolloutError(f"{plan.req.model}: the new build was {status}: {err}; version {plan.serving} keeps serving")


def preflight(req: RolloutRequest) -> Plan:
    """Everything that can be checked before touching the served repository.

    Raises:
        RolloutError: no such build or served model, the interface differs, or the build cannot run here.
    """
    targets = server_targets(req.state_dir)
    repo = targets[0].ep.repo
    if repo is None:
        raise RolloutError(
            f"the server of {req.state_dir} names no repository: start it with make serve or make cluster"
        )
    build_model_dir = req.source / req.model
    if not (build_model_dir / mv.CONFIG).exists():
        raise RolloutError(
            f"{build_model_dir}/{mv.CONFIG} not found: build the model into {req.source} first "
            f"(make build-engines MODELS={req.model} REPO={req.source})"
        )
    entry = read_manifest(req.source)["models"].get(req.model)
    if entry is None:
        raise RolloutError(f"{req.source}/manifest.json has no entry for {req.model}: build it with make build-engines")
    config = parse_pbtxt((build_model_dir / mv.CONFIG).read_text())
    served_config = parse_pbtxt((repo / req.model / mv.CONFIG).read_text()) if (repo / req.model).is_dir() else None
    _check_compatible(req.model, config, served_config)
    _check_runnable(req, entry)
    serving = _serving_version(targets, req.model)
    served_entry = read_manifest(repo)["models"].get(req.model, {})
    files = mv.ModelFiles.read(build_model_dir)
    build_dir = mv.newest_version(build_model_dir)
    return Plan(
        req=req,
        targets=targets,
        repo=repo,
        build_dir=build_dir,
        files=files,
        config=config,
        entry=entry,
        serving=serving,
        served_entry=served_entry,
    )


def server_targets(state_dir: Path) -> list[Target]:
    """Every tritonserver of the state folder: the replicas of `make cluster` or of `make serve` (behind
    its edge), each on its own port, or the one server `--no-edge` started."""
    folders = sorted(p.parent for p in state_dir.glob("replica-*/" + endpoints.STATE))
    states = [(f.name, endpoints.read_state(f)) for f in folders] or [("server", endpoints.read_state(state_dir))]
    return [
        Target(
            n,
            Endpoint("http", s.http_url, s.admin_headers("http"), Path(s.repo)),
            s.pid,
            f"http://{s.host}:{s.metrics_port}/metrics",
        )
        for n, s in states
    ]


def _check_compatible(model: str, config, served) -> None:
    if served is None:
        raise RolloutError(
            f"{model} is not in the served repository: rollouts replace a served model "
            "(serve a new model by building it into the repository and restarting)"
        )
    if config.name != model:
        raise RolloutError(f"the build's config names the model {config.name!r}, not {model!r}")
    policy = config.version_policy.WhichOneof("policy_choice")
    if policy not in (None, "latest") or (policy == "latest" and config.version_policy.latest.num_versions != 1):
        raise RolloutError(
            f"{model}: the build's version_policy serves several versions ({policy}); a rollout "
            "serves one (latest 1): remove version_policy from its config.pbtxt"
        )
    before, after = _interface(served), _interface(config)
    if before != after:
        raise RolloutError(
            f"{model}: the build changes the model's interface, which would break its clients:\n"
            f"  served: {before}\n  build:  {after}\n"
            "serve it under a new name instead (build it with another name and restart)"
        )
    if 0 < config.max_batch_size < served.max_batch_size:
        raise RolloutError(
            f"{model}: the build's max_batch_size {config.max_batch_size} is below the served "
            f"{served.max_batch_size}: clients sending larger batches would fail"
        )


def _interface(config) -> dict:
    inputs = [(t.name, t.data_type, list(t.dims), t.format) for t in config.input]
    outputs = [(t.name, t.data_type, list(t.dims)) for t in config.output]
    return {"batching": config.max_batch_size > 0, "inputs": inputs, "outputs": outputs}


def _check_runnable(req: RolloutRequest, entry: dict) -> None:
    try:
        launcher.guard_manifest({"models": {req.model: entry}})
    except ToolError as err:  # GuardError: built for another GPU, torch or triton
        raise RolloutError(f"{req.model}: {err}") from None
    problem = launcher.numpy_problem(req.source, models=[req.model])
    if problem:
        raise RolloutError(problem)


def _serving_version(targets: list[Target], model: str) -> int:
    found = {}
    for target in targets:
        ready = _ready_versions(target.ep, model)
        if not ready:
            raise RolloutError(
                f"{model} has no ready version on {target.name} ({target.ep.url}): check `make status` and its log"
            )
        found[target.name] = max(ready)
    if len(set(found.values())) > 1:
        raise RolloutError(f"{model}: the servers serve different versions {found}; restart them, then roll out")
    return max(found.values())


def _ready_versions(ep: Endpoint, model: str) -> list[int]:
    try:
        with ep.client() as client:
            index = client.get_model_repository_index(headers=ep.admin_headers)
    except Exception as err:
        raise RolloutError(f"cannot read the model index of {ep.url}: {err}") from None
    return [int(m["version"]) for m in index if m["name"] == model and m.get("state") == "READY" and m.get("version")]


def _load(ep: Endpoint, model: str, timeout: float) -> None:
    """Load (or reload) a model; CheckFailed with Triton's reason if it fails."""
    from tritonclient.utils import InferenceServerException

    try:
        with ep.client(network_timeout=timeout) as client:
            client.load_model(model, headers=ep.admin_headers)
    except InferenceServerException as err:
        hint = " (is the server in explicit model-control mode? `make serve` is)" if "explicit" in str(err) else ""
        raise CheckFailed(f"loading {model} failed: {err.message()}{hint}") from None


def _unload(ep: Endpoint, model: str) -> None:
    try:
        with ep.client() as client:
            client.unload_model(model, headers=ep.admin_headers)
    except Exception as err:  # the candidate's folder goes anyway; report and go on
        step(f"unloading {model} failed ({err}); its folder is removed")


def _checks(plan: Plan, model: str, version: str, accuracy: bool, ep: Endpoint | None = None) -> dict:
    """Smoke request, and the accuracy gate where the build has labeled data whose input the model takes."""
    ep = ep or plan.ep
    batch = _example_batch(plan)
    results = smoke(ep, model, version, plan.spec, batch)
    data = labeled_data(plan.spec) if accuracy and plan.entry.get("accuracy") is not None else None
    if data is not None and _takes(plan.config, data):
        measured = served_accuracy(ep, model, version, data, plan.config.max_batch_size)
        serving = plan.served_entry.get("accuracy")
        results.update(accuracy_gate(measured, plan.entry["accuracy"], serving, plan.req.gate))
    else:
        results["accuracy"] = "not checked (the build has no labeled data for this input)"
    step(f"{model} v{version}: " + ", ".join(f"{k} {v}" for k, v in results.items()))
    return results


def _example_batch(plan: Plan) -> int:
    """The batch of a check's requests: 2 rows where the model batches (fewer if its max is 1), else none."""
    return min(2, plan.config.max_batch_size) if plan.config.max_batch_size else 0


def _warm(plan: Plan, candidate: str) -> dict:
    """The candidate warmed on every server before its first step: as many users as it has instances (at least 2),
    for warm_s seconds each."""
    from tpserve.clients.checks import warm_up

    batch = _example_batch(plan)
    users = max(2, sum(group.count or 1 for group in plan.config.instance_group))
    found = {"requests": 0, "failed": 0}
    for target in plan.targets:
        got = warm_up(target.ep, candidate, "1", plan.spec, batch, plan.req.warm_s, users)
        found = {k: found[k] + got[k] for k in found}
    step(f"{candidate}: warmed with {found['requests']} requests ({found['failed']} failed) before its first step")
    return found


def _takes(config, data) -> bool:
    """Whether the model has the labeled data's input with its dtype and per-sample dims (a uint8 variant has not)."""
    from tritonclient.grpc import model_config_pb2 as pb

    from tpserve.clients.inputs import numpy_dtype

    name, x, _ = data
    tensor = next((t for t in config.input if t.name == name), None)
    if tensor is None:
        return False
    dtype = numpy_dtype(pb.DataType.Name(tensor.data_type).removeprefix("TYPE_"))
    return dtype == x.dtype and list(tensor.dims) == list(x.shape[1:])


def _canary(plan: Plan, candidate: str) -> None:
    folder = plan.repo / candidate
    mv.remove(folder)  # a leftover of an interrupted rollout (we hold the lock)
    step(f"{plan.req.model}: loading the build beside the serving v{plan.serving} as {candidate}")
    try:
        _write_candidate(plan, candidate, folder)
        _load(plan.ep, candidate, plan.req.timeout)
        plan.checks = _checks(plan, candidate, "1", accuracy=True)
    finally:
        _unload(plan.ep, candidate)
        mv.remove(folder)
        _await(lambda: not _stale_stubs(plan.targets[0], plan, None), plan.req.timeout)


def _await(condition, timeout: float, settle: float = 1.0) -> bool:
    """Poll condition until true (then wait settle seconds, for the supervisor's next round) or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            time.sleep(settle)
            return True
        time.sleep(0.2)
    return False


def _write_candidate(plan: Plan, candidate: str, folder: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{candidate}-", dir=plan.repo))
    try:
        shutil.copytree(plan.build_dir, staging / "1")
        config = type(plan.config)()
        config.CopyFrom(plan.config)
        config.name = candidate
        plan.files.write(staging, proto_to_pbtxt(config).encode())
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _promote(plan: Plan) -> int:
    """Copy in and load the next version; verify it; roll back on failure. Returns the new version."""
    model, before = plan.req.model, mv.ModelFiles.read(plan.model_dir)
    version = _next_version(plan)
    step(f"{model}: rolling in the build as v{version} (v{plan.serving} serves until v{version} is ready)")
    mv.copy_in(plan.build_dir, plan.model_dir / str(version))
    plan.files.write(plan.model_dir)
    for target in plan.targets:  # one server at a time: the others serve meanwhile
        try:
            _load(target.ep, model, plan.req.timeout)
            checks = _checks(plan, model, str(version), accuracy=not plan.req.canary, ep=target.ep)
            plan.checks = {**plan.checks, "after_promotion": checks} if plan.checks else checks
        except CheckFailed as err:
            _rollback(plan, version, before)
            _refuse(plan, "rolled back", err)
        _await_retired(plan, target, version)
    return version


def _next_version(plan: Plan) -> int:
    history = plan.served_entry.get("history") or []
    seen = [h["version"] for h in history if isinstance(h.get("version"), int)]
    return max([*mv.disk_versions(plan.model_dir), *seen, plan.serving]) + 1


def _rollback(plan: Plan, version: int, before: mv.ModelFiles) -> None:
    step(f"{plan.req.model}: v{version} failed; rolling back to v{plan.serving}")
    mv.remove(plan.model_dir / str(version))
    before.write(plan.model_dir)
    for target in plan.targets:  # a server still on the old version loads nothing new: a no-op for Triton
        try:
            _load(target.ep, plan.req.model, plan.req.timeout)
        except CheckFailed as err:
            raise RolloutError(
                f"{plan.req.model}: rollback to v{plan.serving} failed too on {target.name}: {err}; "
                "see the server log, then restart the server (make stop; make serve)"
            ) from None
        _await_retired(plan, target, plan.serving)


def _await_retired(plan: Plan, target: Target, version: int) -> None:
    """Wait until `version` alone is ready on target and no stub of another version (or of the candidate)
    lives, so that the supervisor sees the swap while the lock still holds."""
    model = plan.req.model
    alone = lambda: not _stale_stubs(target, plan, version) and _ready_versions(target.ep, model) == [version]  # noqa: E731
    if not _await(alone, plan.req.timeout):
        raise RolloutError(
            f"{model}: v{version} serves on {target.name}, but other versions were still loaded after "
            f"{plan.req.timeout:.0f} s; see the server log"
        )


def _stale_stubs(target: Target, plan: Plan, version: int | None) -> list:
    """Stubs of the candidate, and of the model's versions other than `version`, on target."""
    from tpserve.server.triton.processes import stubs

    candidate, model = CANDIDATE.format(model=plan.req.model), plan.req.model
    other = (lambda v: v != str(version)) if version is not None else (lambda v: False)  # noqa: E731
    ours = candidate if not plan.candidate_serving else None
    return [s for s in stubs(target.pid) if s[0] == ours or (s[0] == model and other(s[1]))]


def _recorded(plan: Plan, version: int) -> dict:
    pruned = mv.prune(plan.model_dir, plan.req.keep, version)
    event = {
        "version": version,
        "status": "serving",
        "source": str(plan.req.source.resolve()),
        "sha256": plan.entry.get("sha256"),
        "previous": plan.serving,
        "checks": plan.checks,
        "pruned_versions": pruned,
    }
    mv.record(plan.repo, plan.req.model, event, mv.versioned_entry(plan.entry, plan.req.model, version))
    return event
