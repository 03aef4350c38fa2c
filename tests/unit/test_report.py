"""Reports from run folders: tables, plots, reasons for missing rows, change against an earlier run."""

import json
from pathlib import Path

from loadtest import perf
from loadtest.report import build_report

FIXTURE = Path(__file__).parents[1] / "fixtures" / "perf_analyzer_verbose.csv"


def _run(folder: Path, scale: float) -> Path:
    rows = perf.parse_csv(FIXTURE, perf.Sweep("digits_cnn"), batch=1, kind="concurrency")
    for row in rows:
        row["throughput"] *= scale
    folder.mkdir()
    perf.write_csv(rows, folder / "perf.csv")
    (folder / "environment.json").write_text(json.dumps({"host": {"gpu": None, "cpu": "test"}}))
    return folder


def test_report_has_tables_plots_history_and_reasons(tmp_path):
    earlier, current = _run(tmp_path / "20260101-000000", 1.0), _run(tmp_path / "20260102-000000", 1.1)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "manifest.json").write_text(json.dumps({"models": {"digits_cnn": {"kind": "KIND_CPU", "accuracy": 0.98,
                                                                               "precision": "fp32"}}}))  # fmt: skip
    text = build_report(current, repo, earlier).read_text()
    assert "| CPU | digits_cnn |" in text and "no CUDA GPU on this host" in text and "make build-engines-docker" in text
    assert "+10.0%" in text and "927.8 → 1020.5" in text
    for image in ("perf.png", "accuracy_speed.png"):
        assert f"]({image})" in text and (current / image).stat().st_size > 5000
    page = (current / "report.html").read_text()
    assert page.count("<table>") == 3 and '<img src="perf.png"' in page


def test_soak_growth_is_measured_after_the_warmup():
    from loadtest.soak import growth

    samples = [(0, "server", 1, 50.0), (0, "stub #0", 2, 10.0), (60, "server", 1, 100.0),
               (60, "stub #0", 2, 20.0), (120, "server", 1, 104.0), (120, "stub #0", 3, 20.0)]  # fmt: skip
    rows = [{"t_s": t, "process": p, "pid": pid, "rss_mib": rss} for t, p, pid, rss in samples]
    table = {r["process"]: r for r in growth(rows, warmup=60)}
    assert table["server"]["growth_pct"] == 4.0 and table["server"]["same_pid"]
    assert table["stub #0"]["growth_pct"] == 0.0 and not table["stub #0"]["same_pid"]
    assert table["total"]["from_mib"] == 120.0 and table["total"]["to_mib"] == 124.0
