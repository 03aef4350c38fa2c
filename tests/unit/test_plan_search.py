"""The capacity plan's parts that need no server: the search's order (jump from one replica's capacity, bisect,
knobs one size below, clear misses end a trial at its probe), the verdicts, a replay's figures, the deployment's
repository (knobs written into copies, the user's configs untouched) and the report folder."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from tpserve.common.errors import MeasurementError
from tpserve.loadtest.planning import report
from tpserve.loadtest.planning.deployment import AS_BUILT, Deployment, repository_for, start_command
from tpserve.loadtest.planning.plan import Plan, PlanRequest, Traffic
from tpserve.loadtest.planning.search import Space, per_replica_capacity, replicas_needed, search
from tpserve.loadtest.planning.trial import CLEAR_MISS, MEETS, MISSES, Trial, figures, judge

SLO, OFFERED, PER_REPLICA, COUNT = 50.0, 1000.0, 300.0, 10_000


def _trial(deployment: Deployment, probe: bool, **given) -> Trial:
    base = dict(
        speed=2.0,
        probe=probe,
        offered_per_s=OFFERED,
        sent=COUNT,
        failed=0,
        p99_ms=10.0,
        answered_per_s=OFFERED,
        over_slo=0,
        behind_ms=0.0,
    )
    return Trial(deployment=deployment, **{**base, **given})


class Host:
    """A stand-in for the replays: a deployment keeps up when its replicas' capacity (instances add half a
    replica's worth each) exceeds the offered rate; the delays given help one size below."""

    def __init__(self, helpful_delay: int | None = None):
        self.asked: list[tuple[Deployment, bool]] = []
        self.helpful_delay = helpful_delay

    def capacity(self, d: Deployment) -> float:
        extra = 0.5 * (max(1, d.instances) - 1)
        bonus = 1.4 if d.delay_us == self.helpful_delay else 1.0
        return PER_REPLICA * d.replicas * (1 + extra) * bonus

    def __call__(self, d: Deployment, probe: bool) -> Trial:
        self.asked.append((d, probe))
        capacity = self.capacity(d)
        if capacity >= OFFERED:
            return judge(_trial(d, probe), SLO, COUNT)
        slow = COUNT // 2 if probe else COUNT
        trial = _trial(d, probe, answered_per_s=capacity, p99_ms=5000.0, over_slo=slow)
        return judge(trial, SLO, COUNT)


def test_the_search_jumps_from_one_replicas_capacity_then_bisects():
    host = Host()
    found = search(Space(max_replicas=8, instances=(1, 2), delays_us=()), host)
    assert found.chosen is not None and found.chosen.verdict == MEETS
    # 1000/s at 80% of 300/s per replica: 5 replicas wanted; 3 replicas x 2 instances (1350/s) is the smallest
    assert (found.chosen.deployment.replicas, found.chosen.deployment.instances) == (3, 2)
    tried = [d for d, _ in host.asked]
    assert tried[0] == Deployment(1, 1)  # one replica first
    assert Deployment(5, 1) in tried  # the jump, not a walk through every size
    assert len({(d.replicas, d.instances) for d in tried}) < len(Space(max_replicas=8).sizes()) / 2
    clear = [d for d, probe in host.asked if probe and host.capacity(d) < OFFERED]
    assert clear and all((d, False) not in host.asked for d in clear), "a clear miss skips the whole replay"


class BurstyHost(Host):
    """The edge refuses a burst (HTTP 503) wherever fewer than `needs` requests may wait on a replica."""

    def __init__(self, needs: int):
        super().__init__()
        self.needs = needs

    def __call__(self, d: Deployment, probe: bool) -> Trial:
        if (d.max_waiting or 64) < self.needs:
            self.asked.append((d, probe))
            return judge(_trial(d, probe, failed=30, failures={"http 503": 30}), SLO, COUNT)
        return super().__call__(d, probe)


def test_a_burst_the_edge_refused_is_tried_again_with_twice_the_waiting_bound_and_kept():
    host = BurstyHost(needs=128)
    found = search(Space(max_replicas=8, instances=(1,), delays_us=(), waiting_base=64), host)
    assert found.chosen is not None and found.chosen.deployment == Deployment(4, 1, AS_BUILT, max_waiting=128)
    assert [d.max_waiting for d, _ in host.asked[:3]] == [0, 0, 128], "probe and whole refused, then twice the bound"
    assert all(d.max_waiting == 128 for d, _ in host.asked[2:]), "later sizes keep the larger bound"
    endless = BurstyHost(needs=10_000)
    found = search(Space(max_replicas=2, instances=(1,), delays_us=(), waiting_base=64), endless)
    assert found.chosen is None and max(d.max_waiting for d, _ in endless.asked) == 256, "doubled twice at most"


def test_a_batching_knob_that_helps_one_size_below_is_chosen():
    host = Host(helpful_delay=1000)
    found = search(Space(max_replicas=8, instances=(1,), delays_us=(0, 1000, 5000)), host)
    assert found.chosen is not None
    assert found.chosen.deployment == Deployment(3, 1, 1000)  # 3 x 300 x 1.4 = 1260/s; 4 replicas without


def test_nothing_on_this_host_meets_and_the_capacity_says_how_many_replicas():
    host = Host()
    found = search(Space(max_replicas=2, instances=(1,), delays_us=(0,)), host)
    assert found.chosen is None and found.largest_miss is not None
    capacity = per_replica_capacity(found.trials)
    assert capacity == pytest.approx(PER_REPLICA)
    assert replicas_needed(OFFERED * 2, capacity) == math.ceil(2000 / 240)


def test_verdicts_read_the_slo_the_failures_and_the_probe():
    d = Deployment()
    assert judge(_trial(d, False), SLO, COUNT).verdict == MEETS
    assert judge(_trial(d, False, p99_ms=51.0), SLO, COUNT).verdict == MISSES
    assert judge(_trial(d, False, failed=1), SLO, COUNT).verdict == MISSES
    assert judge(_trial(d, True, over_slo=COUNT // 100), SLO, COUNT).verdict != CLEAR_MISS  # exactly 1%: may still meet
    assert judge(_trial(d, True, over_slo=COUNT // 100 + 1), SLO, COUNT).verdict == CLEAR_MISS


def test_a_replays_figures():
    class Item:
        def __init__(self, offset):
            self.offset_s = offset

    items = [Item(i * 0.01) for i in range(101)]  # 100/s over 1 s
    sent = [{"sent_s": i * 0.01, "ms": 5.0 if i < 99 else 80.0, "status": "ok"} for i in range(100)]
    sent.append({"sent_s": 1.0, "ms": 1.0, "status": "http 503"})
    found = figures(sent, items, SLO)
    assert found["offered_per_s"] == pytest.approx(101)
    assert found["failed"] == 1 and found["over_slo"] == 1 and found["sent"] == 101
    assert found["p99_ms"] == 5.0  # the 99th of 100 answers by nearest rank
    assert found["failures"] == {"http 503": 1}, "what the failed ones got, said the way each protocol says it"
    missing = figures(sent[:50], items, SLO)
    assert missing["failed"] == 51, "requests the replay never sent count as failed"
    many = [{"sent_s": 0.0, "ms": 1.0, "status": s} for s in ("http 500", "http 400", "http 404", "http 429") * 3]
    many.append({"sent_s": 0.0, "ms": 1.0, "status": "http 503"})  # the edge's refusal, the least common answer
    cut = figures(many, items, SLO)
    assert len(cut["failures"]) == 4 and "http 503" not in cut["failures"] and cut["refused"] == 1


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.onnx").write_bytes(b"weights")
    (repo / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        "instance_group { count: 2 kind: KIND_CPU }\ndynamic_batching { max_queue_delay_microseconds: 100 }\n"
    )
    (repo / "e").mkdir()
    (repo / "e" / "config.pbtxt").write_text('name: "e"\nplatform: "ensemble"\nmax_batch_size: 8\n')
    return repo


def test_a_deployments_repository_carries_its_knobs_and_leaves_the_users_alone(tmp_path):
    repo = _repo(tmp_path)
    before = (repo / "m" / "config.pbtxt").read_text()
    assert repository_for(repo, Deployment(2), tmp_path / "d0") == repo  # no knob: the user's own repository
    assert repository_for(repo, Deployment(1, 2, 100), tmp_path / "d0") == repo  # the knobs it has already
    made = repository_for(repo, Deployment(1, 3, 0), tmp_path / "d1")
    config = (made / "m" / "config.pbtxt").read_text()
    assert "count: 3" in config and "KIND_CPU" in config and "max_queue_delay_microseconds" not in config  # 0
    assert (made / "m" / "1" / "model.onnx").stat().st_ino == (repo / "m" / "1" / "model.onnx").stat().st_ino
    assert "instance_group" not in (made / "e" / "config.pbtxt").read_text(), "an ensemble has no instances"
    assert (repo / "m" / "config.pbtxt").read_text() == before
    assert not (tmp_path / "d1" / "repository.partial").exists()
    with pytest.raises(MeasurementError, match="no model"):
        repository_for(tmp_path / "empty", Deployment(1, 2), tmp_path / "d2")
    assert start_command(Deployment(1), repo) == f"make serve REPO={repo}"
    assert start_command(Deployment(3, gpu_per_replica=True), repo).endswith("REPLICAS=3 GPU_PER_REPLICA=1")
    assert Deployment(2, AS_BUILT, 1000).slug() == "r2-iasbuilt-d1000"
    assert Deployment(1, max_waiting=128).slug() == "r1-iasbuilt-dasbuilt-w128"
    assert start_command(Deployment(1, max_waiting=128), repo) == f"make serve REPO={repo} MAX_WAITING=128"


def test_a_plan_request_refuses_what_cannot_be_planned(tmp_path):
    with pytest.raises(MeasurementError, match="positive"):
        PlanRequest(recording=tmp_path, repo=tmp_path, slo_p99_ms=0, growth=2, out=tmp_path)
    with pytest.raises(MeasurementError, match="instances"):
        PlanRequest(recording=tmp_path, repo=tmp_path, slo_p99_ms=5, growth=2, out=tmp_path, instances=(0,))


def sample_plan(tmp_path) -> Plan:
    """A plan as the search finds it on the stand-in host (4 replicas of 300/s for 1000/s), closed and probed."""
    repo = _repo(tmp_path)
    request = PlanRequest(recording=tmp_path / "rec", repo=repo, slo_p99_ms=SLO, growth=2, out=tmp_path / "out")
    request.out.mkdir()
    found = search(Space(max_replicas=8, instances=(1,), delays_us=()), Host())
    chosen = found.chosen
    assert chosen is not None
    closing = _trial(chosen.deployment, False, phases_us={"queue_us": 120.0, "compute_us": 900.0, "requests": 9})
    return Plan(
        request,
        Traffic(tmp_path / "rec", ("m",), COUNT, 20.0, {}),
        Space(max_replicas=8, instances=(1,)),
        found,
        judge(closing, SLO, COUNT),
        judge(_trial(chosen.deployment, True, speed=3.0), SLO, COUNT),
        per_replica_capacity(found.trials),
        replicas_needed(OFFERED, PER_REPLICA),
    )


def test_the_report_folder(tmp_path):
    plan = sample_plan(tmp_path)
    request, found = plan.request, plan.found
    path = report.write(plan, "python -m tpserve.loadtest plan ...")
    text = path.read_text()
    copy = request.out / "deployments" / "r4-i1-dasbuilt" / "repository"
    assert f"make cluster REPO={copy} REPLICAS=4" in text and (copy / "m" / "config.pbtxt").exists()
    assert "the plan holds" in text and "120 µs waiting in the queue" in text
    assert "kubectl scale deployment/triton --replicas=4" in text and "extrapolation" not in text
    assert "The load generator (fast) fell at most" in text
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["chosen"]["deployment"]["replicas"] == 4
    plan.found.chosen = plan.closing = plan.headroom = None
    plan.found.trials[0] = replace(plan.found.trials[0], failures={"grpc UNAVAILABLE": 7}, client_busy=0.5)
    text = report.write(plan, "python -m tpserve.loadtest plan ...").read_text()
    assert "- 1: grpc UNAVAILABLE ×7" in text and "busiest process used at most 50% of a core" in text
    assert "In 1 trial, 7 of the failures were the edge refusing past the 64 requests" in text
    plan.found.trials[1] = replace(plan.found.trials[1], deployment=Deployment(2, max_waiting=128))
    text = report.write(plan, "python -m tpserve.loadtest plan ...").read_text()
    assert "refused bursts past 64 requests waiting on a replica; with 128 allowed to wait, they waited" in text
    assert "Nothing this host can run meets" in text and "an extrapolation" in text
    assert "each with a host of its own: 8 replicas on this one share its cores" in text
    assert "kubectl scale deployment/triton --replicas=5" in text
    assert (tmp_path / "out" / "plan.html").exists() and (tmp_path / "out" / "plan.png").stat().st_size > 1000
    data = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert data["chosen"] is None and len(data["trials"]) == len(found.trials)


def test_a_closing_replay_that_failed_recommends_nothing_and_says_what_to_try(tmp_path):
    """Seen on an H200 host: the search's trials met the SLO, the closing replay got HTTP 503 from the edge's
    bound on waiting requests in a burst; the report must not tell anyone to launch on it."""
    plan = sample_plan(tmp_path)
    assert plan.closing is not None
    failed = replace(plan.closing, failed=106, failures={"http 503": 106})
    plan.closing = judge(failed, SLO, COUNT)
    text = report.write(plan, "python -m tpserve.loadtest plan ...").read_text()
    assert "No deployment this host can run held the closing replay" in text and "Run 4 replicas" not in text
    assert "106 of the failures were the edge refusing past the 64 requests that may wait" in text
    assert "MAX_WAITING=128" in text and "No replica count to apply" in text and "kubectl scale" not in text
    waited = replace(plan.closing, deployment=replace(plan.closing.deployment, max_waiting=500))
    plan.found.chosen, plan.closing = replace(plan.found.chosen, deployment=waited.deployment), waited
    text = report.write(plan, "python -m tpserve.loadtest plan ...").read_text()
    assert "past the 500 requests" in text and "MAX_WAITING=1000" in text and "REPLICAS=4 MAX_WAITING=500" in text


def test_deployments_serving_the_same_configs_are_measured_once_but_the_closing_replay_always_runs(
    tmp_path, monkeypatch
):
    from tpserve.loadtest.planning import plan as planning

    runs = []

    def replayed(run, deployment, speed, seconds, slo_ms, name):
        runs.append(deployment)
        fields = dict(offered_per_s=10.0, sent=10, failed=0, p99_ms=5.0, answered_per_s=10.0, over_slo=0)
        return {**fields, "behind_ms": 0.0, "phases_us": {}}

    monkeypatch.setattr(planning, "run_trial", replayed)
    repo = _repo(tmp_path)  # instances 2, delay 100 as built
    request = PlanRequest(recording=tmp_path, repo=repo, slo_p99_ms=SLO, growth=2, out=tmp_path / "out")
    evaluate = planning.Evaluator(request, Traffic(tmp_path, ("m",), 10, 10.0, {}))
    first = evaluate(Deployment(1), False)
    same = evaluate(Deployment(1, 2, 100), False)
    assert len(runs) == 1 and same.verdict == first.verdict and "as 1 replica, instances as built" in same.why
    evaluate(Deployment(1, 2, 0), False)
    evaluate(Deployment(1, 2, 100), False, fresh=True)
    assert len(runs) == 3


def test_a_choice_whose_closing_replay_misses_gives_way_to_the_next_size():
    from tpserve.loadtest.planning.plan import _closed
    from tpserve.loadtest.planning.search import Search

    space = Space(max_replicas=3, instances=(1,))
    found = Search(chosen=judge(_trial(Deployment(1, 1), False), SLO, COUNT))
    closings = []

    def evaluate(deployment, probe, growth=None, fresh=False):
        closings.append(deployment)
        p99 = 80.0 if deployment.replicas == 1 else 20.0  # the search's meet was noise's
        return judge(_trial(deployment, probe, p99_ms=p99), SLO, COUNT)

    closing = _closed(found, space, evaluate)
    assert closing.verdict == MEETS and closing.deployment == Deployment(2, 1)
    assert found.chosen is closing and [t.deployment for t in found.overruled] == [Deployment(1, 1)]
    assert closings == [Deployment(1, 1), Deployment(2, 1)]


def test_a_closing_replay_refused_in_a_burst_is_closed_again_with_twice_the_waiting_bound():
    """As on an H200 host: the search met, the fresh closing replay got 503s from the edge's waiting bound."""
    from tpserve.loadtest.planning.plan import _closed
    from tpserve.loadtest.planning.search import Search

    space = Space(max_replicas=1, instances=(1,), waiting_base=64)
    found = Search(chosen=judge(_trial(Deployment(1, 1), False), SLO, COUNT))
    closings = []

    def evaluate(deployment, probe, growth=None, fresh=False):
        closings.append(deployment)
        if deployment.max_waiting < 128:
            return judge(_trial(deployment, probe, failed=106, failures={"http 503": 106}), SLO, COUNT)
        return judge(_trial(deployment, probe), SLO, COUNT)

    closing = _closed(found, space, evaluate)
    assert closing.verdict == MEETS and closing.deployment == Deployment(1, 1, max_waiting=128)
    assert closings == [Deployment(1, 1), Deployment(1, 1, max_waiting=128)]


def test_this_hosts_sizes_are_one_replica_per_gpu_or_within_the_cores(monkeypatch, tmp_path):
    from tpserve.loadtest.planning import plan as planning

    request = PlanRequest(recording=tmp_path, repo=tmp_path, slo_p99_ms=SLO, growth=2, out=tmp_path)
    for gpus, most, own in ((1, 1, False), (4, 4, True)):
        monkeypatch.setattr(planning, "gpu_count", lambda gpus=gpus: gpus)
        space = planning.space_of(request)
        assert (space.max_replicas, space.gpu_per_replica, space.gpus) == (most, own, gpus)
    monkeypatch.setattr(planning, "gpu_count", lambda: 0)
    assert 1 <= planning.space_of(request).max_replicas <= 4 and planning.space_of(request).gpus == 0
    assert planning.space_of(replace(request, max_replicas=3)).max_replicas == 3
