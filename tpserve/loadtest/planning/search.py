"""The plan's search, apart from how a trial runs: from what one replica sustains, jump to the size that should
carry the load, bisect between the largest miss and the smallest meet, then try the batching knobs one size
below the choice; every trial a short probe first, so that a clear miss costs seconds, not the whole replay.

`evaluate(deployment, probe)` runs one trial and returns it judged (trial.judge)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tpserve.loadtest.planning.deployment import AS_BUILT, Deployment
from tpserve.loadtest.planning.trial import CLEAR_MISS, MEETS, Trial, refused

TARGET_UTILISATION = 0.8  # a p99 SLO needs slack: a deployment is sized for its capacity at this share


@dataclass(frozen=True, kw_only=True)
class Space:
    """Sizes to search (replicas x instances per model) and the batching delays tried one size below."""

    max_replicas: int
    instances: tuple[int, ...] = (1, 2)
    delays_us: tuple[int, ...] = (0, 1000, 5000)
    gpu_per_replica: bool = False
    gpus: int = 0  # on this host: a replica is one GPU's worth where there is one
    waiting: int = 0  # the requests that may wait on a replica to start from (0: as serve sets them)
    waiting_base: int = 64  # what 0 means here (server/edge/admission.waiting_bound of the repository)
    waiting_doublings: int = 2  # where the edge refused past them (a burst), twice as many, at most this often

    def sizes(self) -> list[Deployment]:
        """Every size, cheapest first (fewer replicas, then fewer instances), delays as built."""
        return sorted(
            (
                Deployment(replicas, instances, AS_BUILT, self.gpu_per_replica)
                for replicas in range(1, self.max_replicas + 1)
                for instances in self.instances
            ),
            key=Deployment.cost,
        )


@dataclass
class Search:
    """What the search measured, in order, and what it chose (None: nothing on this host met the SLO)."""

    trials: list[Trial] = field(default_factory=list)
    chosen: Trial | None = None
    largest_miss: Trial | None = None
    overruled: list[Trial] = field(default_factory=list)  # choices whose closing replay missed
    waiting: int = 0  # the bound every later trial starts from (raised where the edge refused in a burst)

    def record(self, trial: Trial) -> Trial:
        self.trials.append(trial)
        return trial


def per_replica_capacity(trials: list[Trial]) -> float | None:
    """Answers per second one replica sustained when it could not keep up (answered below 95% of offered);
    None where no trial was overloaded."""
    overloaded = [t.answered_per_s / t.deployment.replicas for t in trials if t.answered_per_s < 0.95 * t.offered_per_s]
    return max(overloaded) if overloaded else None


def replicas_needed(offered_per_s: float, capacity: float) -> int:
    """Replicas that carry offered_per_s at TARGET_UTILISATION of each one's capacity."""
    return max(1, math.ceil(offered_per_s / (capacity * TARGET_UTILISATION)))


def _tried(
    evaluate: Callable[[Deployment, bool], Trial], search: Search, deployment: Deployment, space: Space
) -> Trial:
    """The deployment with the search's bound on waiting requests, as a probe, then (unless the probe is a clear
    miss) the whole replay, both recorded. Where it missed and the edge refused past that bound (a burst of the
    recording), the same again with twice the bound (space.waiting_doublings times at most); later trials keep
    the larger bound."""
    trial = _probe_then_whole(evaluate, search, replace(deployment, max_waiting=search.waiting))
    most = space.waiting_base << space.waiting_doublings
    while trial.verdict != MEETS and refused(trial) and (search.waiting or space.waiting_base) * 2 <= most:
        search.waiting = (search.waiting or space.waiting_base) * 2
        trial = _probe_then_whole(evaluate, search, replace(deployment, max_waiting=search.waiting))
    return trial


def _probe_then_whole(evaluate, search: Search, deployment: Deployment) -> Trial:
    probe = search.record(evaluate(deployment, True))
    if probe.verdict == CLEAR_MISS:
        return probe
    return search.record(evaluate(deployment, False))


def _jump(sizes: list[Deployment], low: int, trial: Trial) -> int:
    """The index of the first size (past low) with the replicas the miss's capacity says are needed."""
    capacity = per_replica_capacity([trial])
    if capacity is None:  # not overloaded, and yet a miss (latency, not throughput): the next size
        return low + 1
    wanted = replicas_needed(trial.offered_per_s, capacity)
    later = [i for i in range(low + 1, len(sizes)) if sizes[i].replicas >= wanted]
    return later[0] if later else len(sizes) - 1


def search(space: Space, evaluate: Callable[[Deployment, bool], Trial]) -> Search:
    """The smallest deployment of the space that meets the SLO (see the module's text)."""
    sizes, found = space.sizes(), Search(waiting=space.waiting)
    low, high = -1, None  # sizes[low] missed (-1: none tried), sizes[high] met
    at = 0
    while high is None and at < len(sizes):
        trial = _tried(evaluate, found, sizes[at], space)
        if trial.verdict == MEETS:
            high = at
            found.chosen = trial
            break
        low, found.largest_miss = at, trial
        if at == len(sizes) - 1:
            break
        at = _jump(sizes, low, trial)
    while high is not None and high - low > 1:  # bisect between the largest miss and the smallest meet
        middle = (low + high) // 2
        trial = _tried(evaluate, found, sizes[middle], space)
        if trial.verdict == MEETS:
            high, found.chosen = middle, trial
        else:
            low, found.largest_miss = middle, trial
    if high is not None and low >= 0:  # the knobs, one size below the choice
        for delay in space.delays_us:
            trial = _tried(evaluate, found, replace(sizes[low], delay_us=delay), space)
            if trial.verdict == MEETS:
                found.chosen = trial
                break
    return found
