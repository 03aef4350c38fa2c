"""The canary's gate (operations/canary.py): windows from Triton's counters, breaches on errors and latency
against the old version, the last step's old figures standing in at 100%, and the share set to 0 before a breach
is raised (on a test clock)."""

import pytest

from common.errors import ServerError
from operations import canary
from operations.canary import CanaryBreach, CanaryPlan, Counts, breach, run_steps, window

PLAN = CanaryPlan(steps=(10, 100), hold_s=3.0, poll_s=1.0)


def test_a_window_is_the_difference_of_two_snapshots():
    found = window(Counts(100, 1, 100_000, []), Counts(190, 11, 190_000, [8000.0, 9000.0]))
    assert found == {"requests": 100, "failed": 10, "error_share": 0.1, "latency_ms": 1.0, "summary_p99_ms": 9.0}
    assert window(Counts(0, 0, 0), Counts(10, 0, 50_000))["summary_p99_ms"] is None


@pytest.mark.parametrize(
    "candidate, why",
    [
        ({"requests": 100, "failed": 5, "error_share": 0.05, "latency_ms": 2.0}, "errors"),
        ({"requests": 100, "failed": 0, "error_share": 0.0, "latency_ms": 400.0}, "latency"),
        ({"requests": 100, "failed": 0, "error_share": 0.0, "latency_ms": 7.9}, None),
        ({"requests": 5, "failed": 0, "error_share": 0.0, "latency_ms": 400.0}, None),
    ],
)
def test_breaches_on_errors_and_latency_against_the_old_version(candidate, why):
    old = {"requests": 900, "failed": 0, "error_share": 0.0, "latency_ms": 2.0}
    found = breach(candidate, old, PLAN)
    assert (found or "").startswith(why) if why else found is None


@pytest.mark.parametrize("steps", [(), (10, 5), (0, 50), (50, 101)])
def test_steps_rise_within_1_to_100(steps):
    with pytest.raises(ServerError, match="rising percents"):
        CanaryPlan(steps=steps)


class World:
    """Counters that grow as the test clock advances: the candidate fails `fail_share` of its requests."""

    def __init__(self, fail_share: float):
        self.now, self.share, self.fail_share, self.shares = 0.0, 0, fail_share, []
        self.counts = {"m": Counts(), "m__candidate": Counts()}

    def sleep(self, seconds):
        self.now += seconds
        for name, part in (("m__candidate", self.share / 100), ("m", 1 - self.share / 100)):
            sent = 100 * seconds * part
            failed = sent * self.fail_share if name == "m__candidate" else 0.0
            c = self.counts[name]
            c.success, c.failure, c.duration_us = (
                c.success + sent - failed,
                c.failure + failed,
                c.duration_us + sent * 2000,
            )
            c.p99_us = [3000.0]

    def set_share(self, socket, model, percent):
        self.share = percent
        self.shares.append(percent)


def _run(world, monkeypatch):
    monkeypatch.setattr(canary, "set_share", world.set_share)
    snapshot = lambda urls, models: {m: Counts(**vars(world.counts[m])) for m in models}  # noqa: E731
    monkeypatch.setattr(canary, "read_counts", snapshot)
    return run_steps(PLAN, "m", "m__candidate", "sock", ["url"], clock=lambda: world.now, sleep=world.sleep)


def test_a_good_candidate_holds_every_step_and_100_percent_compares_with_the_last_old_window(monkeypatch):
    world = World(fail_share=0.0)
    steps = _run(world, monkeypatch)
    assert [s["percent"] for s in steps] == [10, 100] and all(s["breach"] is None for s in steps)
    assert steps[-1]["old"]["requests"] == 0 and world.shares == [10, 100]


def test_a_failing_candidate_is_cut_off_at_once_within_its_step(monkeypatch):
    world = World(fail_share=0.05)
    with pytest.raises(CanaryBreach, match="step 10%: errors") as caught:
        _run(world, monkeypatch)
    assert world.shares == [10, 0] and caught.value.steps[-1]["seconds"] <= 2 * PLAN.poll_s  # its first failure


def test_a_step_without_traffic_fails_for_lack_of_evidence(monkeypatch):
    world = World(fail_share=0.0)
    world.sleep = lambda seconds: setattr(world, "now", world.now + seconds)  # nothing arrives
    with pytest.raises(CanaryBreach, match="too little traffic to judge: 0 requests in 9 s"):
        _run(world, monkeypatch)
    assert world.shares == [10, 0]
