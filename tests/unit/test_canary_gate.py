"""The canary's gate (operations/canary.py): windows from the edge's route stats (answers by status class, a
latency histogram) and Triton's counters (mean latency), Envoy's JSON stats read into routes, breaches on errors,
mean latency and p99 against the old version, the last step's old figures standing in at 100%, and the share set
to 0 before a breach is raised (on a test clock)."""

import pytest

from tpserve.common.errors import ServerError
from tpserve.operations import canary
from tpserve.operations.canary import CanaryBreach, CanaryPlan, Counts, Route, _route, breach, p99_ms, run_steps, window

PLAN = CanaryPlan(steps=(10, 100), hold_s=3.0, poll_s=1.0)


def test_a_window_is_the_difference_of_two_snapshots():
    before = Route(100, 1, 2, {1.0: 90, 5.0: 100, 60000.0: 100})
    after = Route(200, 11, 3, {1.0: 180, 5.0: 198, 60000.0: 200})
    found = window(Counts(100, 100_000), Counts(190, 190_000), before, after)
    assert found == {
        "requests": 100,
        "failed": 10,
        "client_errors": 1,
        "error_share": 0.1,
        "latency_ms": 1.0,
        "p99_ms": 5.0,  # 98 of 100 under 5 ms: 2 past it are fewer than the 5 a tail rests on
    }
    assert window(Counts(), Counts(), Route(), Route())["p99_ms"] is None


def test_the_p99_is_the_bound_of_the_bucket_holding_the_99th_percent():
    assert p99_ms({}, {1.0: 990, 2.0: 999, 5.0: 1000}) == 1.0
    assert p99_ms({1.0: 500}, {1.0: 900, 2.0: 1000, 5.0: 1400}) == 5.0  # the window: 400, 500, 900
    assert p99_ms({1.0: 5}, {1.0: 5}) is None


def test_a_short_windows_p99_rests_on_five_requests_so_two_hiccups_do_not_make_it():
    hiccups = {1.0: 125, 8.0: 127, 60000.0: 127}  # 127 requests, 2 of them 8 ms: the gate's flake, as figures
    assert p99_ms({}, hiccups) == 1.0
    regressed = {1.0: 122, 8.0: 127, 60000.0: 127}  # 5 past 1 ms: a tail of its own
    assert p99_ms({}, regressed) == 8.0
    assert p99_ms({}, {1.0: 593, 8.0: 600}) == 8.0  # over 500 requests it is the p99: 7 past 1 ms are over 1%
    assert p99_ms({}, {1.0: 995, 8.0: 1000}) == 1.0


def test_envoys_json_stats_are_read_into_each_route():
    stats = [
        {"name": "vhost.triton_http.route.canary-new-m.upstream_rq_completed", "value": 40},
        {"name": "vhost.triton_http.route.canary-new-m.upstream_rq_5xx", "value": 2},
        {"name": "vhost.triton_http.route.canary-new-m.upstream_rq_4xx", "value": 1},
        {"name": "vhost.triton_http.route.canary-old-m.upstream_rq_completed", "value": 400},
        {"name": "vhost.triton_http.route.canary-new-m2.upstream_rq_completed", "value": 7},  # another model
        {
            "histograms": [
                {
                    "name": "vhost.triton_http.route.canary-new-m.upstream_rq_time",
                    "buckets": [{"upper_bound": 1, "cumulative": 30}, {"upper_bound": 60000, "cumulative": 40}],
                }
            ]
        },
    ]
    assert _route(stats, "canary-new-m") == Route(40, 2, 1, {1.0: 30, 60000.0: 40})
    assert _route(stats, "canary-old-m") == Route(completed=400)


@pytest.mark.parametrize(
    "candidate, why",
    [
        ({"requests": 100, "failed": 5, "error_share": 0.05, "latency_ms": 2.0}, "errors"),
        ({"requests": 100, "failed": 0, "error_share": 0.0, "latency_ms": 400.0}, "latency"),
        ({"requests": 100, "failed": 0, "error_share": 0.0, "latency_ms": 7.9}, None),
        ({"requests": 5, "failed": 0, "error_share": 0.0, "latency_ms": 400.0}, None),
        ({"requests": 100, "failed": 0, "error_share": 0.0, "latency_ms": 2.0, "p99_ms": 65.0}, "latency: p99"),
        ({"requests": 99, "failed": 0, "error_share": 0.0, "latency_ms": 2.0, "p99_ms": 65.0}, None),
        ({"requests": 100, "failed": 0, "error_share": 0.0, "latency_ms": 2.0, "p99_ms": 20.0}, None),
    ],
)
def test_breaches_on_errors_and_latency_against_the_old_version(candidate, why):
    old = {"requests": 900, "failed": 0, "error_share": 0.0, "latency_ms": 2.0, "p99_ms": 10.0}
    found = breach(candidate, old, PLAN)
    assert (found or "").startswith(why) if why else found is None


@pytest.mark.parametrize("steps", [(), (10, 5), (0, 50), (50, 101)])
def test_steps_rise_within_1_to_100(steps):
    with pytest.raises(ServerError, match="rising percents"):
        CanaryPlan(steps=steps)


class World:
    """Counters that grow as the test clock advances: the candidate answers `fail_share` of its requests 5xx."""

    def __init__(self, fail_share: float):
        self.now, self.share, self.fail_share, self.shares = 0.0, 0, fail_share, []
        self.counts = {"m": Counts(), "m__candidate": Counts()}
        self.routes = {"old": Route(), "new": Route()}

    def sleep(self, seconds):
        self.now += seconds
        for name, side, part in (("m__candidate", "new", self.share / 100), ("m", "old", 1 - self.share / 100)):
            sent = 100 * seconds * part
            failed = sent * self.fail_share if side == "new" else 0.0
            c, r = self.counts[name], self.routes[side]
            c.success, c.duration_us = c.success + sent, c.duration_us + sent * 2000
            r.completed, r.server_errors = r.completed + sent, r.server_errors + failed
            r.buckets = {2.0: r.completed, 60000.0: r.completed}

    def set_share(self, socket, model, percent):
        self.share = percent
        self.shares.append(percent)


def _run(world, monkeypatch):
    monkeypatch.setattr(canary, "set_share", world.set_share)
    snapshot = lambda urls, models: {m: Counts(**vars(world.counts[m])) for m in models}  # noqa: E731
    monkeypatch.setattr(canary, "read_counts", snapshot)
    edge = lambda socket, model: {s: Route(**vars(r)) for s, r in world.routes.items()}  # noqa: E731
    monkeypatch.setattr(canary, "read_edge", edge)
    return run_steps(PLAN, "m", "m__candidate", "sock", ["url"], clock=lambda: world.now, sleep=world.sleep)


def test_a_good_candidate_holds_every_step_and_100_percent_compares_with_the_last_old_window(monkeypatch):
    world = World(fail_share=0.0)
    steps = _run(world, monkeypatch)
    assert [s["percent"] for s in steps] == [10, 100] and all(s["breach"] is None for s in steps)
    assert steps[-1]["old"]["requests"] == 0 and world.shares == [10, 100]


def test_at_100_percent_a_p99_is_not_judged_against_an_older_window(monkeypatch):
    world = World(fail_share=0.0)
    steady = world.sleep

    def sleep(seconds):  # the host gets busier once all traffic is on the candidate: 1 request in 10 takes 9 ms
        before = world.routes["new"].completed
        steady(seconds)
        if world.share == 100:
            r = world.routes["new"]
            r.buckets = {2.0: r.buckets[2.0] - 0.1 * (r.completed - before), 9.0: r.completed, 60000.0: r.completed}

    world.sleep = sleep
    assert [s["breach"] for s in _run(world, monkeypatch)] == [None, None]


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


def test_make_rollouts_canary_takes_whole_percents_or_says_how():
    from tpserve.operations.__main__ import _percents

    assert _percents("1 10 50 100") == (1, 10, 50, 100)
    with pytest.raises(ServerError, match="CANARY='ten 100': whole percents"):
        _percents("ten 100")
