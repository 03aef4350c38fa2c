"""The HTML reports as a reader opens them: a real headless browser (tests/browser.py) loads each page from its
folder and finds its tables and plots drawn, no console error, no failed request, no local link to nowhere.

Reports: perf (report.html), Locust (locust.html, and report.html of a Locust run), the replay, the capacity plan,
text-bench,
gpu-bench and the soak, each written by the code that writes it in a run (figures from committed runs where the
run needs a GPU)."""

import json
import shutil
from pathlib import Path

import pytest

from tests.browser import Page, missing_reason, open_page

pytestmark = [
    pytest.mark.functional,
    pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or ""),
]
DOCS = Path(__file__).parents[2] / "docs"


def _readable(page: Page, tables: int, images: int) -> None:
    assert page.console_errors == [] and page.failed_requests == [], page
    assert page.broken_images == [] and page.broken_links == [], page
    assert page.tables >= tables and page.images >= images and page.rows > page.tables, page


def test_the_perf_report_renders(tmp_path):
    from tests.unit.test_report import _run
    from tpserve.loadtest.reporting.report import build_report

    run = _run(tmp_path / "20260102-000000", 1.0)
    build_report(run, None)
    _readable(open_page(run / "report.html"), tables=2, images=1)


def test_the_text_bench_report_renders(tmp_path):
    from tpserve.loadtest.benches import text_bench

    rows = text_bench.rows_from_csv(DOCS / "cpu" / "text_bench_2core.csv")
    text_bench.write_report(rows, tmp_path, "# minilm: text in-process and served")
    page = open_page(tmp_path / "text_bench.html")
    _readable(page, tables=1, images=1)
    assert page.title == "minilm: text in-process and served"


def test_the_gpu_bench_report_renders(tmp_path):
    from tpserve.loadtest.benches import gpu_bench

    rows = gpu_bench.rows_from_csv(DOCS / "gpu" / "gpu_bench_h100.csv")
    gpu_bench.write_report(rows, tmp_path, "# resnet50: CPU vs GPU vs TensorRT")
    _readable(open_page(tmp_path / "gpu_bench.html"), tables=1, images=1)


def test_the_capacity_plan_renders(tmp_path):
    from tests.unit.test_plan_search import sample_plan
    from tpserve.loadtest.planning import report

    page = open_page(report.write(sample_plan(tmp_path), "python -m tpserve.loadtest plan ...").with_suffix(".html"))
    _readable(page, tables=1, images=1)


def test_the_replay_report_renders(tmp_path):
    from tpserve.loadtest.reporting.replay_report import write_report

    per_second = [3, 5, 4, 6, 2]
    summary = {
        "recorded_total": 20,
        "replayed_total": 20,
        "total_diff_pct": 0.0,
        "per_second_r": 1.0,
        "behind_ms": 1.5,
        "left_out": {},
        "speed": 1.0,
        "recorded_per_second": per_second,
        "replayed_per_second": per_second,
        "models": [
            {
                "model": "<b>digits_cnn</b>",  # a name a server chose: shown as text, never as markup
                "recorded": 20,
                "replayed": 20,
                "recorded_p50_ms": 1.0,
                "recorded_p99_ms": 2.0,
                "replayed_p50_ms": 1.1,
                "replayed_p99_ms": 2.2,
            }
        ],
        "statuses": [{"protocol": "http", "status": "ok", "recorded": 20, "replayed": 20}],
    }
    write_report(summary, tmp_path, "Replayed at speed 1.")
    _readable(open_page(tmp_path / "replay.html"), tables=2, images=1)
    assert "&lt;b&gt;digits_cnn&lt;/b&gt;" in (tmp_path / "replay.html").read_text()


def test_the_soak_report_renders(tmp_path):
    from tpserve.loadtest.reporting.html_page import write_html

    for name in ("soak.md", "soak.png"):
        shutil.copy(DOCS / "soak" / name, tmp_path / name)
    _readable(open_page(write_html(tmp_path / "soak.md")), tables=1, images=1)


def test_a_locust_run_reads_in_the_browser(served, tmp_path):
    from tpserve.loadtest.locust_suite import run as locust_run
    from tpserve.loadtest.reporting.report import build_report

    run = locust_run.LocustRun(models=(("digits_cnn", 1),), protocol="http", users=2, run_time_s=3)
    locust_run.run_locust(run, served.state, tmp_path)
    (tmp_path / "environment.json").write_text(json.dumps({"host": {"cpu": "test"}}))
    build_report(tmp_path, None)
    locust = open_page(tmp_path / "locust.html", wait_ms=1500)
    _readable(locust, tables=2, images=0)
    assert locust.drawn > 0, "Locust's charts were not drawn"
    _readable(open_page(tmp_path / "report.html"), tables=1, images=1)


def test_the_docs_site_reads_offline(tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    subprocess.run(command, cwd=root, check=True, capture_output=True, timeout=300, env=env)
    for page in ("index.html", "quickstart/index.html", "benchmarks/index.html"):
        found = open_page(tmp_path / "site" / page)
        assert found.console_errors == [] and found.failed_requests == [] and found.broken_links == [], found
    assert open_page(tmp_path / "site" / "commands" / "index.html").tables >= 2
