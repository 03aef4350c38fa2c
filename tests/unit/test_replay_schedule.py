"""A recording as a replay (loadtest/workloads/recorded.py): arrival order and speed, what is left out, the open-loop
dispatcher on a test clock (never early, never held back by a slow answer), inputs of the recorded shapes, and the
figures that compare a replay with its recording."""

import math

import numpy as np
import pytest

from tpserve.common.errors import RecordingError
from tpserve.common.traffic import RecordedInput, RecordedRequest
from tpserve.loadtest.reporting.replay_report import summarize
from tpserve.loadtest.workloads.recorded import (
    ReplayItem,
    correlation,
    dispatch,
    per_second,
    read_schedule,
    schedule,
    synthetic_inputs,
    write_schedule,
)

IMAGE = (RecordedInput("input", "FP32", (2, 1, 8, 8)),)


def _request(t_us: int, model: str = "digits_cnn", **kw) -> RecordedRequest:
    return RecordedRequest(
        arrival_us=t_us, model=model, protocol=kw.pop("protocol", "http"), inputs=kw.pop("inputs", IMAGE), **kw
    )


def test_schedule_orders_by_arrival_divides_by_speed_and_says_what_it_left_out():
    recorded = [_request(3_000_000), _request(1_000_000, protocol="grpc"), _request(2_000_000, inputs=(), status=400)]
    recorded.append(_request(2_500_000, model="other"))
    items, left_out = schedule(recorded, speed=2.0, models=("digits_cnn",))
    assert [(i.offset_s, i.protocol) for i in items] == [(0.0, "grpc"), (1.0, "http")]
    assert left_out == {"no inputs read (status 400: refused before the server)": 1, "model other not asked for": 1}
    forced, _ = schedule(recorded[:2], protocol="grpc")
    assert {i.protocol for i in forced} == {"grpc"}


@pytest.mark.parametrize("speed", [0, -1, float("nan")])
def test_a_speed_must_be_positive(speed):
    with pytest.raises(RecordingError, match="positive factor"):
        schedule([_request(0)], speed=speed)


def test_nothing_to_replay_is_said():
    with pytest.raises(RecordingError, match="nothing in the recording can be replayed"):
        schedule([_request(0, inputs=(), status=400)])


def test_the_schedule_reads_back_as_written(tmp_path):
    items = [ReplayItem(0.5, "m", "2", "grpc", IMAGE, {"body": "AAAA", "header_length": 0})]
    assert read_schedule(write_schedule(items, tmp_path / "s.jsonl")) == items


class Clock:
    """A test clock: sleep advances it; nothing waits for real."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def test_dispatch_is_open_loop_on_time_and_never_early():
    clock, sent = Clock(), []
    items = [ReplayItem(t, "m", "", "http", IMAGE) for t in (0.0, 0.25, 0.25, 1.0, 3.5)]

    def never_answered(item):  # were the dispatcher to wait for an answer, it would wait for ever
        raise AssertionError("the dispatcher ran a send itself instead of spawning it")

    def spawn(send, item):  # the send leaves now, in a greenlet of its own (here: never run)
        sent.append((round(clock.now - 100.0, 6), item.offset_s))

    behind = dispatch(items, never_answered, clock, clock.sleep, spawn)
    assert sent == [(0.0, 0.0), (0.25, 0.25), (0.25, 0.25), (1.0, 1.0), (3.5, 3.5)] and behind == 0.0


def test_dispatch_reports_how_far_behind_a_slow_spawn_left_it():
    clock = Clock()
    items = [ReplayItem(t, "m", "", "http", IMAGE) for t in (0.0, 0.1, 0.2)]

    def spawn(send, item):
        clock.now += 0.3  # a spawn that blocks (a host too busy to keep up)

    assert dispatch(items, lambda item: None, clock, clock.sleep, spawn) == pytest.approx(0.4)


def test_synthetic_inputs_have_the_recorded_shapes_and_datatypes():
    item = ReplayItem(0, "m", "", "http", (RecordedInput("ids", "INT64", (3, 17)), RecordedInput("x", "FP16", (3, 4))))
    arrays = synthetic_inputs(item)
    assert arrays["ids"].shape == (3, 17) and arrays["ids"].dtype == np.int64
    assert arrays["x"].shape == (3, 4) and arrays["x"].dtype == np.float16
    image = synthetic_inputs(ReplayItem(0, "p", "", "grpc", (RecordedInput("IMAGE", "BYTES", (2, 1)),)))
    assert image["IMAGE"].shape == (2, 1) and image["IMAGE"][1, 0].startswith(b"\x89PNG")


def test_made_up_bytes_are_refused_with_how_to_record_them():
    with pytest.raises(RecordingError, match="RECORD=values"):
        synthetic_inputs(ReplayItem(0, "m", "", "http", (RecordedInput("blob", "BYTES", (1,)),)))


def test_per_second_counts_and_correlation():
    assert per_second([0.1, 0.9, 1.0, 2.99, 3.0], 3) == [2, 1, 1]
    assert correlation([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert math.isnan(correlation([1, 1, 1], [1, 2, 3]))


def test_summary_puts_recorded_and_replayed_side_by_side():
    arrivals_ms = (0, 100, 200, 300, 1500, 2500, 2600, 3900)  # 4, 1, 2 and 1 requests in its seconds
    recorded = [_request(t * 1000, duration_us=1000 + t) for t in arrivals_ms]
    recorded.append(_request(4_500_000, inputs=(), status=400))
    items, left_out = schedule(recorded)
    sent = [
        {"sent_s": i.offset_s + 0.01, "model": i.model, "protocol": "http", "status": "ok", "ms": 2.0} for i in items
    ]
    sent[-1]["status"] = "http 503"
    summary = summarize(
        {"items": items, "left_out": left_out, "recorded": recorded, "results": {"behind_s": 0.002, "sent": sent}}, 1.0
    )
    assert summary["recorded_total"] == summary["replayed_total"] == 8 and summary["total_diff_pct"] == 0.0
    assert summary["per_second_r"] == pytest.approx(1.0)
    statuses = {(s["status"]): (s["recorded"], s["replayed"]) for s in summary["statuses"]}
    assert statuses == {"ok": (8, 7), "http 503": (0, 1)}
    assert summary["models"][0]["replayed_p50_ms"] == 2.0


def test_two_recordings_compare_by_rate_total_and_shapes():
    from tpserve.loadtest.reporting.replay_report import compare_recordings

    original = [_request(t * 250_000) for t in range(20)] + [_request(9_000_000, inputs=(), status=400)]
    original.append(_request(5_100_000, inputs=(RecordedInput("input", "FP32", (1, 1, 8, 8)),)))
    replayed = [_request(7_000_000 + r.arrival_us // 2, inputs=r.inputs) for r in original if r.inputs]
    same = compare_recordings(original, replayed, speed=2.0)
    assert same["shapes_identical"] and same["total_diff_pct"] == 0.0 and same["per_second_r"] > 0.99
    replayed[-1] = _request(replayed[-1].arrival_us)
    assert compare_recordings(original, replayed, speed=2.0)["shapes_differ_for"] == ["digits_cnn"]


def test_bursts_switch_between_all_users_and_one():
    from tpserve.loadtest.locust_suite.burst import burst_users

    ticks = {t: burst_users(t, 6, 10.0, 20.0, 60.0) for t in (0, 9.9, 10, 29.9, 30, 61)}
    assert ticks == {0: (6, 60), 9.9: (6, 60), 10: (1, 10), 29.9: (1, 10), 30: (6, 60), 61: None}
