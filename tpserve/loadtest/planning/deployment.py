"""A deployment the plan can propose: replicas behind the edge, instances per model, the batching delay; the
repository it serves (the user's, with those knobs written into each model's config) and the commands that
start it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tpserve.common.errors import MeasurementError

AS_BUILT = -1  # a knob left as the repository has it


@dataclass(frozen=True)
class Deployment:
    """One candidate: `replicas` servers (one as `serve` starts it, its checks in the server; more as `cluster`),
    `instances` per model and the dynamic batcher's delay (AS_BUILT: the configs' own); max_waiting: the requests
    that may wait on a replica before the edge refuses (MAX_WAITING=; 0: as `serve` sets it)."""

    replicas: int = 1
    instances: int = AS_BUILT
    delay_us: int = AS_BUILT
    gpu_per_replica: bool = False
    max_waiting: int = 0

    def cost(self) -> tuple[int, int, int, int]:
        """What it takes, for ordering: replicas (hosts' or GPUs' worth) first, then instances."""
        return (self.replicas, max(1, self.instances), max(0, self.delay_us), self.max_waiting)

    def label(self) -> str:
        instances = (
            "instances as built" if self.instances == AS_BUILT else f"{counted(self.instances, 'instance')} per model"
        )
        delay = "" if self.delay_us == AS_BUILT else f", delay {self.delay_us} µs"
        gpus = " (1 GPU each)" if self.gpu_per_replica else ""
        waiting = f", {self.max_waiting} waiting" if self.max_waiting else ""
        return f"{counted(self.replicas, 'replica')}{gpus}, {instances}{delay}{waiting}"

    def slug(self) -> str:
        """A folder name for the deployment (r2-i1-dasbuilt: 2 replicas, 1 instance, delay as built)."""
        knob = {AS_BUILT: "asbuilt"}
        waiting = f"-w{self.max_waiting}" if self.max_waiting else ""
        return (
            f"r{self.replicas}-i{knob.get(self.instances, self.instances)}-d{knob.get(self.delay_us, self.delay_us)}"
            + waiting
        )

    def changes_configs(self) -> bool:
        return self.instances != AS_BUILT or self.delay_us != AS_BUILT


def counted(number: int, noun: str) -> str:
    """'1 replica', '2 replicas'."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _rewritten(config, deployment: Deployment):
    """A model's config with the deployment's knobs (an ensemble has neither: left alone)."""
    if config.platform == "ensemble":
        return config
    if deployment.instances != AS_BUILT:
        kind = config.instance_group[0].kind if config.instance_group else 0
        del config.instance_group[:]
        config.instance_group.add(count=deployment.instances, kind=kind)
    if deployment.delay_us != AS_BUILT and config.HasField("dynamic_batching"):
        config.dynamic_batching.max_queue_delay_microseconds = deployment.delay_us
    return config


def _linked_copy(source: Path, target: Path) -> None:
    """source's tree at target: files hard-linked where the file system allows (no model file is copied twice),
    copied otherwise; folders made private."""

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link, symlinks=False)


def served_configs(repo: Path, deployment: Deployment) -> tuple[str, ...]:
    """The configs the deployment's replicas would load, as text: two deployments with the same replicas and these
    serve the same thing (a knob set to what the config already has changes nothing)."""
    from tpserve.builders.repository.model_config import parse_pbtxt, proto_to_pbtxt

    return tuple(
        proto_to_pbtxt(_rewritten(parse_pbtxt(path.read_text()), deployment))
        for path in sorted(repo.glob("*/config.pbtxt"))
    )


def repository_for(repo: Path, deployment: Deployment, folder: Path) -> Path:
    """The repository a deployment serves: repo itself where no knob changes, else folder/repository, a linked
    copy of repo whose configs carry the knobs (written whole, then renamed into place).

    Raises:
        MeasurementError: repo has no model config to serve.
    """
    from tpserve.builders.repository.model_config import parse_pbtxt, proto_to_pbtxt

    configs = sorted(repo.glob("*/config.pbtxt"))  # the order served_configs writes them in
    if not configs:
        raise MeasurementError(f"{repo} has no model (no */config.pbtxt): build it first (make build-engines)")
    rewritten = dict(zip(configs, served_configs(repo, deployment)))
    if all(text == proto_to_pbtxt(parse_pbtxt(path.read_text())) for path, text in rewritten.items()):
        return repo  # the knobs are the configs' own (or none is set): the user's repository as it is
    target = folder / "repository"
    partial = folder / "repository.partial"
    shutil.rmtree(partial, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    _linked_copy(repo, partial)
    for path, text in rewritten.items():
        copy = partial / path.parent.name / "config.pbtxt"
        copy.unlink()  # a hard link to the user's file: never written through
        copy.write_text(text)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target


def start_command(deployment: Deployment, repository: Path) -> str:
    """The command that starts the deployment on this host (`make serve` / `make cluster`)."""
    waiting = f" MAX_WAITING={deployment.max_waiting}" if deployment.max_waiting else ""
    if deployment.replicas == 1:
        return f"make serve REPO={repository}{waiting}"
    gpus = " GPU_PER_REPLICA=1" if deployment.gpu_per_replica else ""
    return f"make cluster REPO={repository} REPLICAS={deployment.replicas}{gpus}{waiting}"
