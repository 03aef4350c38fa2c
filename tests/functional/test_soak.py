"""A short soak against the session server: RSS of the server and of each stub sampled, nothing failed."""

import csv

import pytest

from tpserve.loadtest.benches.soak import SoakSettings, processes, run

pytestmark = pytest.mark.functional


def test_a_short_soak_samples_every_process_and_writes_its_report(served, tmp_path):
    settings = SoakSettings(model="digits_cnn_pipeline", seconds=12, interval=2, warmup=4, protocols=("http", "grpc"))
    endpoints = [served.endpoint(p) for p in settings.protocols]
    summary = run(settings, endpoints, lambda: processes(served.state.pid), tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "soak.csv")))
    labels = {r["process"] for r in rows}
    assert "tritonserver" in labels
    assert {"digits_cnn_preprocess #0", "digits_cnn #0", "digits_cnn #1", "digits_cnn_postprocess #0"} <= labels
    assert len({r["t_s"] for r in rows}) >= 6 and all(float(r["rss_mib"]) > 1 for r in rows)
    assert summary["requests"] > 20 and summary["failed"] == 0, summary["errors"]
    assert summary["growth"][-1]["process"] == "total"
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert "| tritonserver |" in (tmp_path / "soak.md").read_text()
