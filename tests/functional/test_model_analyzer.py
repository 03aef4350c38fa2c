"""NVIDIA Model Analyzer profiles one of our repositories in its local launch mode, starting this checkout's
tritonserver and perf_analyzer through bin/ (the launchers), with nothing else set up by hand."""

import csv

import pytest

from tpserve.loadtest import model_analyzer

pytestmark = pytest.mark.functional


def test_model_analyzer_profiles_our_repository_through_the_launchers(served, tmp_path):
    try:
        model_analyzer.binary()
    except Exception as err:  # not installed here: `make test` installs it (make install-model-analyzer)
        pytest.skip(str(err))
    search = {"max_concurrency": 2, "max_instance_count": 1, "max_model_batch_size": 2}
    export = model_analyzer.profile(served.repo, ("digits_cnn",), tmp_path, search)
    with open(export / "results" / "metrics-model-inference.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["Model"] for row in rows} == {"digits_cnn"}
    assert {row["Concurrency"] for row in rows} == {"1", "2"}
    assert all(float(row["Throughput (infer/sec)"]) > 0 for row in rows)
    assert any((tmp_path / "checkpoints").glob("*.ckpt")), "its checkpoint: re-analysed without measuring"
    assert (export / "reports" / "summaries" / "digits_cnn" / "result_summary.html").exists()
