"""Config search on a real server in explicit model-control mode."""

import shutil

import pytest

from builders.repository.manifest import read_manifest, update_manifest
from builders.repository.model_config import parse_pbtxt
from loadtest import search
from loadtest.perf.tools import find_perf_analyzer
from server import launcher

pytestmark = pytest.mark.functional


def test_quick_and_exhaustive_search_and_write_back(served, tmp_path):
    repo = tmp_path / "repo"
    for name in ("digits_cnn", "digits_cnn_int8"):
        shutil.copytree(served.repo / name, repo / name)
        update_manifest(repo, read_manifest(served.repo)["models"][name])
    with launcher.running(repo, tmp_path / "state", model_control="explicit") as state:
        ep = state.endpoint("grpc", repo)
        searcher = search.Searcher(
            repo,
            ep,
            find_perf_analyzer(),
            {"p99_ms": 1000.0, "accuracy": 0.01},
            {"concurrency": 4, "interval_ms": 500},
            tmp_path,
        )
        space = search.SearchSpace(
            ("digits_cnn", "digits_cnn_int8"), 1, (0,), {"digits_cnn": 16, "digits_cnn_int8": 16}
        )
        quick = search.quick(space, searcher)
        quick_count = len(searcher.results)
        best = search.exhaustive(space, searcher)
    assert len(space.candidates()) == 6 and len(searcher.results) == 6 and 1 <= quick_count <= 6
    assert best.feasible and best.throughput >= quick.throughput and best.throughput > 0
    path = search.write_back(repo, best.candidate, searcher.base_config(best.candidate.variant))
    written = parse_pbtxt(path.read_text())
    assert written.dynamic_batching.max_queue_delay_microseconds == 0
    assert list(written.dynamic_batching.preferred_batch_size) == list(best.candidate.preferred)
    assert "6 candidates measured" in search.report(searcher.results, best, "exhaustive")


def test_the_accuracy_budget_uses_the_manifest(served):
    manifest = read_manifest(served.repo)["models"]
    variants = ("digits_cnn", "digits_cnn_int8")
    scores = {v: manifest[v]["accuracy"] for v in variants}
    assert all(0.0 < s <= 1.0 for s in scores.values())
    best, other = sorted(variants, key=scores.get, reverse=True)  # whichever trained model won this time
    assert search.accuracy_ok(manifest, best, variants, 0.0)[0]
    # The refusal is checked on a manifest whose gap is set here, not on which trained model wins.
    edited = {**manifest, other: {**manifest[other], "accuracy": scores[best] - 0.02}}
    ok, why = search.accuracy_ok(edited, other, variants, 0.01)
    assert not ok and "below the best" in why
    assert search.accuracy_ok(edited, other, variants, 0.03)[0]
