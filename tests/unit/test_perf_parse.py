"""Parsing perf_analyzer's --verbose-csv (a file a real run wrote) into tidy rows."""

from pathlib import Path

import pytest

from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.perf import sweep as perf
from tpserve.loadtest.reporting import perf_rows

FIXTURE = Path(__file__).parents[1] / "fixtures" / "perf_analyzer_verbose.csv"


def test_rows_carry_latency_in_ms_and_breakdown_in_us():
    rows = perf.parse_csv(FIXTURE, perf.Sweep("digits_cnn"), batch=1, kind="concurrency")
    assert [r["level"] for r in rows] == [1.0, 4.0]
    first = rows[0]
    assert first["throughput"] == pytest.approx(927.759)
    assert first["p50_ms"] == pytest.approx(1.058) and first["p99_ms"] == pytest.approx(1.295)
    assert first["queue_us"] == 592 and first["compute_infer_us"] == 196
    assert set(first) == set(perf_rows.COLUMNS)


def test_markdown_table_has_a_row_per_measurement():
    rows = perf.parse_csv(FIXTURE, perf.Sweep("digits_cnn"), batch=1, kind="concurrency")
    table = perf_rows.markdown_table(rows)
    assert table.count("\n| digits_cnn |") == 2 and "2726.3" in table


def test_arguments_carry_load_shared_memory_and_admin_header(tmp_path):
    sweep = perf.Sweep("m", request_rates=(50,), concurrency=(), shared_memory="system", batch_sizes=(4,))
    ep = Endpoint("grpc", "127.0.0.1:9", {"triton-grpc-protocol-admin-key": "k"})
    args = perf.perf_args(sweep, ep, 4, sweep.loads()[0], tmp_path / "x.csv")
    joined = " ".join(args)
    assert "--request-rate-range 50" in joined and "-b 4" in joined and "--shared-memory system" in joined
    assert "-H triton-grpc-protocol-admin-key:@TRITON_ADMIN_KEY@" in joined and ":k " not in joined + " "
    assert perf.admin_secret(ep) == "k"  # passed through a pipe, not argv


def test_empty_sweeps_are_refused():
    with pytest.raises(MeasurementError, match="at least one concurrency"):
        perf.Sweep("m", concurrency=())


VERBOSE = """Request concurrency: 4
  Pass [1] throughput: 3946.18 infer/sec. Avg latency: 1010 usec (std 1007 usec).
  Pass [2] throughput: 3745.01 infer/sec. Avg latency: 1067 usec (std 708 usec).
  Pass [3] throughput: 800.364 infer/sec. Avg latency: 4840 usec (std 21040 usec).
Failed to obtain stable measurement within 3 measurement windows for concurrency 4."""


def test_window_spread_is_the_widest_of_throughput_and_latency():
    mean_latency = (1010 + 1067 + 4840) / 3
    assert perf.window_spread(VERBOSE) == pytest.approx(100 * (4840 - 1010) / mean_latency, abs=0.1)
    assert perf.window_spread("no passes printed") == 0.0


def test_stability_is_said_beside_the_figure():
    assert perf_rows.stability({"stable": "yes"}) == "stable"
    assert perf_rows.stability({"stable": "no", "spread_pct": 30.0}) == "unstable ±15%"


def test_retries_lengthen_the_window():
    first, longer = perf.attempts(perf.Sweep("m", measurement_ms=500, max_trials=5))
    assert (first.measurement_ms, longer.measurement_ms, longer.max_trials) == (500, 1000, 8)


def test_rows_written_before_stability_was_recorded_read_as_stable(tmp_path):
    rows = perf.parse_csv(FIXTURE, perf.Sweep("digits_cnn"), batch=1, kind="concurrency")
    perf_rows.write_csv(rows, tmp_path / "perf.csv")
    old = tmp_path / "old.csv"
    lines = (tmp_path / "perf.csv").read_text().splitlines()
    cut = len(perf_rows.COLUMNS) - 3
    old.write_text("\n".join(",".join(line.split(",")[:cut]) for line in lines) + "\n")
    assert all(r["stable"] == "yes" for r in perf_rows.read_csv(old))


def test_a_window_too_short_to_hold_a_request_counts_as_unstable():
    text = "Pass [1] cb::Error: No valid requests recorded within time interval. Please use a larger time window."
    assert any(words in text for words in perf.UNSTABLE)
