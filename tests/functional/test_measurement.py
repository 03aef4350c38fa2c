"""Real perf_analyzer and real Locust against the embedded server."""

import csv

import pytest

from tpserve.loadtest.locust_suite import run as locust_run
from tpserve.loadtest.perf import sweep as perf
from tpserve.loadtest.perf.tools import find_perf_analyzer
from tpserve.loadtest.reporting import perf_rows
from tpserve.loadtest.reporting.plots import throughput_vs_latency

pytestmark = pytest.mark.functional


def test_perf_analyzer_sweep_gives_a_tidy_table_and_plot(served, tmp_path):
    sweep = perf.Sweep(
        "digits_cnn",
        protocol="grpc",
        concurrency=(1, 4),
        batch_sizes=(1, 2),
        measurement_ms=500,
        stability_percent=100,
        max_trials=10,
    )
    rows = perf.run_sweep(sweep, served.endpoint("grpc"), find_perf_analyzer(), tmp_path / "raw")
    assert [(r["batch"], r["level"]) for r in rows] == [(1, 1.0), (1, 4.0), (2, 1.0), (2, 4.0)]
    assert all(r["throughput"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0 for r in rows)
    assert all(r["compute_infer_us"] > 0 for r in rows)
    perf_rows.write_csv(rows, tmp_path / "perf.csv")
    with open(tmp_path / "perf.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 4
    assert throughput_vs_latency(rows, tmp_path / "perf.png").stat().st_size > 10_000


def test_perf_analyzer_over_http_with_request_rate(served, tmp_path):
    sweep = perf.Sweep(
        "digits_cnn",
        protocol="http",
        concurrency=(),
        request_rates=(100,),
        measurement_ms=2000,
        stability_percent=100,
        max_trials=10,
    )
    (row,) = perf.run_sweep(sweep, served.endpoint("http"), find_perf_analyzer(), tmp_path)
    # the rate is what drives it (digits_cnn answers thousands a second when driven by concurrency); a 2-core host
    # busy with other work lags the schedule (75/s once), so the floor is loose and the ceiling is the rate's
    assert row["load"] == "request_rate" and 50 <= row["throughput"] <= 125, row


def test_locust_with_two_worker_processes_over_http(served, tmp_path):
    run = locust_run.LocustRun(models=(("digits_cnn", 1),), protocol="http", users=4, run_time_s=4, processes=2)
    result = locust_run.run_locust(run, served.state, tmp_path)
    (row, total) = result.rows
    assert row["name"] == "digits_cnn b1" and row["type"] == "HTTP"
    assert row["requests"] > 50 and row["failures"] == 0 and result.slo_ok
    assert (tmp_path / "locust.html").stat().st_size > 0
    assert "worker" in (tmp_path / "locust.log").read_text().lower()


def test_locust_mixed_workload_with_the_ensembles_over_grpc(served, tmp_path):
    models = (("digits_cnn", 3), ("resnet18_64", 1), ("digits_cnn_pipeline", 2), ("minilm_pipeline", 1))
    run = locust_run.LocustRun(models=models, protocol="grpc", users=6, run_time_s=5)
    result = locust_run.run_locust(run, served.state, tmp_path)
    names = {r["name"]: r for r in result.rows}
    assert set(names) == {f"{m} b1" for m, _ in models} | {"Aggregated"}
    assert all(r["failures"] == 0 and r["requests"] > 0 for r in names.values())


def test_the_slo_watchdog_fails_a_run_that_breaches_it(served, tmp_path):
    run = locust_run.LocustRun(models=(("digits_cnn", 1),), protocol="grpc", users=2, run_time_s=20, slo_p99_ms=0.01)
    result = locust_run.run_locust(run, served.state, tmp_path)
    assert result.slo_ok is False
    assert "SLO breached" in (tmp_path / "locust.log").read_text()


def test_locust_counts_server_errors_as_failures(served, tmp_path):
    run = locust_run.LocustRun(
        models=(("digits_cnn", 1),), protocol="http", users=2, run_time_s=3, batch=64
    )  # > max batch 16
    result = locust_run.run_locust(run, served.state, tmp_path)
    row = result.rows[0]
    assert row["requests"] > 0 and row["failures"] == row["requests"] and result.exit_code == 1


def test_reconciliation_measures_both_tools_at_the_same_load(served, tmp_path):
    from benchmarks import reconcile

    ep = served.endpoint("grpc")
    result = reconcile.reconcile(served.state, ep, find_perf_analyzer(), "resnet18_64", 2, 4, tmp_path)
    assert result.perf_p50_ms > 0 and result.locust_p50_ms > 0 and result.locust_tput > 0
    assert result.agrees == (result.gap <= reconcile.TOLERANCE)
    text = reconcile.markdown([result])
    assert "resnet18_64" in text and ("agree" in text if result.agrees else "Why they can differ" in text)


def test_a_point_that_cannot_stabilize_is_kept_and_flagged(served, tmp_path):
    # a 0.001% stability bound is not met by any real host: the point must still give a row
    sweep = perf.Sweep(
        "digits_cnn", protocol="grpc", concurrency=(2,), measurement_ms=200, stability_percent=0.001, max_trials=3
    )
    (row,) = perf.run_sweep(sweep, served.endpoint("grpc"), find_perf_analyzer(), tmp_path)
    assert row["throughput"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
    assert row["stable"] in ("yes", "no") and row["window_ms"] >= 200
    if row["stable"] == "no":
        assert row["spread_pct"] >= 0 and "unstable ±" in perf_rows.markdown_table([row])


def test_a_failed_point_keeps_the_finished_ones(served, tmp_path):
    ep, analyzer, failures = served.endpoint("grpc"), find_perf_analyzer(), []
    rows = perf.run_sweep(
        perf.Sweep("digits_cnn", concurrency=(1,), measurement_ms=300, stability_percent=100),
        ep,
        analyzer,
        tmp_path,
        failures,
    )
    rows += perf.run_sweep(
        perf.Sweep("no_such_model", concurrency=(1,), measurement_ms=300), ep, analyzer, tmp_path, failures
    )
    assert len(rows) == 1 and rows[0]["model"] == "digits_cnn"
    assert [f.model for f in failures] == ["no_such_model"] and "no_such_model" in perf.failures_table(failures)


def test_the_closed_loop_client_answers_every_request_and_says_how_busy_it_was(served):
    """Our gRPC client (what text-bench drives varied lengths with) against the real server: requests of 1 and 3
    rows, every one answered, rows counted per request, and each process's CPU time reported (some work, at most every
    core of the host: gRPC's own threads count with the process's)."""
    import os

    import numpy as np

    from tpserve.loadtest.workloads import ragged_load

    made = [{"input": np.full((rows, 1, 8, 8), i, np.float32)} for i, rows in enumerate((1, 3, 1, 3))]
    payloads = ragged_load.serialize("digits_cnn", made, ["logits"])
    ep = served.endpoint("grpc")
    result = ragged_load.run(ep.url, payloads, [1, 3, 1, 3], concurrency=4, seconds=2.0, processes=2, warmup_s=0.5)
    assert result.errors == 0 and result.requests > 0 and result.processes == 2
    assert result.requests <= result.rows <= 3 * result.requests
    assert 0 < result.client_busy <= (os.cpu_count() or 1)


def test_the_closed_loop_client_over_http_counts_a_refused_request_and_the_others_succeed(served):
    """The same client over HTTP (one keep-alive connection a user): a request the server refuses (a wrong
    datatype) is an error with Triton's own message, and every other request on the same connections succeeds."""
    import numpy as np

    from tpserve.loadtest.workloads import ragged_load

    ep = served.endpoint("http")
    made = [{"input": np.full((rows, 1, 8, 8), i, np.float32)} for i, rows in enumerate((1, 3, 1))]
    made.append({"input": np.zeros((1, 1, 8, 8), np.float64)})  # FP64: digits_cnn takes FP32
    payloads = ragged_load.serialize_http("digits_cnn", made, ["logits"], ep.url)
    result = ragged_load.run(
        ep.url, payloads, [1, 3, 1, 1], concurrency=4, seconds=2.0, processes=2, warmup_s=0.5, protocol="http"
    )
    assert result.requests > 0 and result.errors > 0 and result.processes == 2
    assert result.first_error.startswith("HTTP 400") and "FP64" in result.first_error
    # the 3-row requests were sent by the process whose other user sent only refused ones: they succeeded
    assert result.requests < result.rows <= 3 * result.requests


def test_text_bench_measures_single_sentences_over_http_with_its_own_client(served):
    """text-bench's client point on the server's HTTP endpoint: every sentence answered, over HTTP."""
    from tpserve.loadtest.benches import text_bench
    from tpserve.loadtest.workloads import text as tw

    point = text_bench.Point(
        path="served ids", model="minilm", encoder="minilm", per_request=1, concurrency=4, interval_ms=500
    )
    measured = text_bench._client_point(point, served.endpoint("http"), tw.Lengths(longest=64).sample(64), processes=1)
    assert measured["throughput"] > 0 and ", 0 failed" in measured["note"]
    assert "the client's 1 process," in measured["client"]
