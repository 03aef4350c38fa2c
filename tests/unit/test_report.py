"""Reports from run folders: tables, plots, reasons for missing rows, change against an earlier run."""

import json
from pathlib import Path

from tpserve.loadtest.perf import sweep as perf
from tpserve.loadtest.reporting import perf_rows
from tpserve.loadtest.reporting.report import build_report

FIXTURE = Path(__file__).parents[1] / "fixtures" / "perf_analyzer_verbose.csv"


def _run(folder: Path, scale: float) -> Path:
    rows = perf.parse_csv(FIXTURE, perf.Sweep("digits_cnn"), batch=1, kind="concurrency")
    for row in rows:
        row["throughput"] *= scale
    folder.mkdir()
    perf_rows.write_csv(rows, folder / "perf.csv")
    (folder / "environment.json").write_text(json.dumps({"host": {"gpu": None, "cpu": "test"}}))
    return folder


def test_report_has_tables_plots_history_and_reasons(tmp_path):
    earlier, current = _run(tmp_path / "20260101-000000", 1.0), _run(tmp_path / "20260102-000000", 1.1)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "manifest.json").write_text(
        json.dumps({"models": {"digits_cnn": {"kind": "KIND_CPU", "accuracy": 0.98, "precision": "fp32"}}})
    )
    text = build_report(current, repo, earlier).read_text()
    assert "| CPU | digits_cnn |" in text and "no CUDA GPU on this host" in text and "make build-engines-docker" in text
    assert "+10.0%" in text and "927.8 → 1020.5" in text
    for image in ("perf.png", "accuracy_speed.png"):
        assert f"]({image})" in text and (current / image).stat().st_size > 5000
    page = (current / "report.html").read_text()
    assert page.count("<table>") == 3 and '<img src="perf.png"' in page


def test_soak_growth_is_measured_after_the_warmup():
    from tpserve.loadtest.benches.soak import growth

    samples = [
        (0, "server", 1, 50.0),
        (0, "stub #0", 2, 10.0),
        (60, "server", 1, 100.0),
        (60, "stub #0", 2, 20.0),
        (120, "server", 1, 104.0),
        (120, "stub #0", 3, 20.0),
    ]
    rows = [{"t_s": t, "process": p, "pid": pid, "rss_mib": rss} for t, p, pid, rss in samples]
    table = {r["process"]: r for r in growth(rows, warmup=60)}
    assert table["server"]["growth_pct"] == 4.0 and table["server"]["same_pid"]
    assert table["stub #0"]["growth_pct"] == 0.0 and not table["stub #0"]["same_pid"]
    assert table["total"]["from_mib"] == 120.0 and table["total"]["to_mib"] == 124.0


def _repo(tmp_path: Path, models: dict) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "manifest.json").write_text(json.dumps({"models": models}))
    return repo


def test_a_class_missing_from_this_run_comes_from_another_run_beside_it(tmp_path):
    _run(tmp_path / "20260101-000000", 1.0)
    locust_only = tmp_path / "20260102-000000"
    locust_only.mkdir()
    repo = _repo(tmp_path, {"digits_cnn": {"kind": "KIND_CPU", "precision": "fp32"}})
    text = build_report(locust_only, repo).read_text()
    assert "| CPU | digits_cnn |" in text and "not in this run: from 20260101-000000" in text


def test_without_any_cpu_measurement_the_row_says_why(tmp_path):
    alone = tmp_path / "20260102-000000"
    alone.mkdir()
    text = build_report(alone, _repo(tmp_path, {})).read_text()
    cpu_row = next(line for line in text.splitlines() if line.startswith("| CPU |"))
    assert cpu_row.rstrip("| ").split("|")[-1].strip(), cpu_row  # the "why missing" cell is not empty


def test_no_empty_accuracy_heading_and_no_comparison_with_unlike_runs(tmp_path):
    other = _run(tmp_path / "20260101-000000", 1.0)
    rows = perf_rows.read_csv(other / "perf.csv")
    for row in rows:
        row["model"] = "another_model"
    perf_rows.write_csv(rows, other / "perf.csv")
    current = _run(tmp_path / "20260102-000000", 1.0)
    text = build_report(current, _repo(tmp_path, {"digits_cnn": {"kind": "KIND_CPU"}})).read_text()
    assert "Accuracy vs speed" not in text
    assert "none beside this one measured the same points" in text and "→" not in text


def test_a_precision_that_did_not_pay_is_said(tmp_path):
    run = _run(tmp_path / "20260101-000000", 1.0)
    rows = perf_rows.read_csv(run / "perf.csv")
    rows += [{**r, "model": "digits_cnn_int8", "throughput": r["throughput"] * 0.8} for r in rows]
    perf_rows.write_csv(rows, run / "perf.csv")
    spec = {"name": "digits_cnn"}
    repo = _repo(
        tmp_path,
        {
            "digits_cnn": {"kind": "KIND_CPU", "precision": "fp32", "spec": spec},
            "digits_cnn_int8": {"kind": "KIND_CPU", "precision": "int8", "spec": spec, "int8": {"int8_speedup": 0.7}},
        },
    )
    text = build_report(run, repo).read_text()
    # beside the served figure, the building host's: slower there too
    row = "| digits_cnn_int8 | int8 | digits_cnn | 0.80x | 0.70x (slower) | did not pay: slower than fp32 here |"
    assert row in text


HISTORY = """Timestamp,User Count,Type,Name,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%
1700000000,4,,Aggregated,0.000000,0.000000,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A
1700000001,4,,Aggregated,1500.0,0.000000,2,2,3,3,3,3,4,5,8,9,9
1700000002,4,,Aggregated,1700.0,1.0,2,2,3,3,3,4,4,6,9,9,9
"""


def test_locust_history_becomes_a_png_of_percentiles_and_rate(tmp_path):
    from tpserve.loadtest.locust_suite.run import history_plot, read_history

    (tmp_path / "h.csv").write_text(HISTORY)
    points = read_history(tmp_path / "h.csv")
    assert [p["t"] for p in points] == [0, 1, 2] and points[2]["p99"] == 6.0 and points[2]["fails"] == 1.0
    assert history_plot(tmp_path / "h.csv", tmp_path / "h.png").stat().st_size > 10_000
    assert history_plot(tmp_path / "missing.csv", tmp_path / "x.png") is None


def test_a_server_gone_after_the_run_still_gives_a_report_that_says_so(tmp_path):
    from tpserve.common.endpoints import Endpoint, free_ports
    from tpserve.loadtest.reporting.report import write_context

    (port,) = free_ports(1)
    write_context(tmp_path, Endpoint("http", f"127.0.0.1:{port}"), ["digits_cnn"])
    environment = json.loads((tmp_path / "environment.json").read_text())
    assert environment["server"]["unreachable"] and environment["models"] == {}
    report = build_report(tmp_path, None).read_text()
    assert f"127.0.0.1:{port} did not answer after the run" in report


def test_refusals_show_with_what_the_server_answered(tmp_path):
    """A Locust run's failures appear in the report grouped by their error, most frequent first: an overload's
    refusal says "reset reason: overflow" there."""
    overflow = (
        "StatusCode.UNAVAILABLE: upstream connect error or disconnect/reset before headers. reset reason: overflow"
    )
    (tmp_path / "locust_failures.csv").write_text(
        "Method,Name,Error,Occurrences\n"
        "GRPC,resnet50 b1,\"RequestFailed('StatusCode.UNAVAILABLE: Exceeds maximum queue size')\",3\n"
        f"GRPC,resnet50 b1,\"RequestFailed('{overflow}')\",220\n"
    )
    (tmp_path / "environment.json").write_text(json.dumps({"host": {"gpu": None, "cpu": "test"}}))
    text = build_report(tmp_path, None).read_text()
    section = text[text.index("Failures, by what the server answered") :]
    assert section.index("reset reason: overflow") < section.index("Exceeds maximum queue size")
    assert "| 220 |" in section


def test_points_that_failed_show_with_why(tmp_path):
    """A run whose points all failed does not read as if nothing ran: each failed point is listed with the reason
    perf_analyzer gave (the server's answer)."""
    why = "perf_analyzer failed (exit 99): Thread [0] had error: indices element out of data bounds"
    (tmp_path / "failed.json").write_text(json.dumps([{"model": "topic", "point": "b1 concurrency 1", "why": why}]))
    (tmp_path / "environment.json").write_text(json.dumps({"host": {"gpu": None, "cpu": "test"}}))
    text = build_report(tmp_path, None).read_text()
    assert "Failed points (1), and why" in text and "indices element out of data bounds" in text


def test_the_console_names_the_failures_reasons(tmp_path):
    from tpserve.loadtest.__main__ import _failure_reasons

    (tmp_path / "locust_failures.csv").write_text(
        "Method,Name,Error,Occurrences\n"
        "GRPC,m b1,\"RequestFailed('a')\",2\n"
        "GRPC,m b1,\"RequestFailed('values must lie in [0, 1000)')\",7\n"
    )
    said = _failure_reasons(tmp_path / "locust_failures.csv").splitlines()
    assert said[0].startswith("  7 x m b1:") and "values must lie" in said[0] and len(said) == 2
