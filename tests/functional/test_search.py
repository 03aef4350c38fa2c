"""Config search on a real server in explicit model-control mode."""

import json
import shutil

import pytest

from tpserve.builders.repository.manifest import read_manifest, update_manifest
from tpserve.builders.repository.model_config import parse_pbtxt
from tpserve.loadtest import search
from tpserve.loadtest.perf.tools import find_perf_analyzer
from tpserve.server.triton import launcher

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
            {"concurrency": (1, 4), "interval_ms": 500, "repeats": 2},
            tmp_path,
        )
        searcher.checkpoint = search.Checkpoint(tmp_path / "checkpoint.jsonl", {"test": 1})
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
    assert best.level in (1, 4) and best.low <= best.throughput <= best.high
    assert [p[0] for p in best.points] == [1, 4], "every level swept, medians of the repeats"
    assert search.plot(searcher.results, best, tmp_path / "search.png").stat().st_size > 1000
    resumed = search.Searcher(repo, None, None, {"p99_ms": 1000.0, "accuracy": 0.01}, {}, tmp_path)
    resumed.checkpoint = search.Checkpoint(tmp_path / "checkpoint.jsonl", {"test": 1})
    again = resumed.measure(best.candidate, ("digits_cnn", "digits_cnn_int8"))  # no server: from the checkpoint
    assert again.throughput == best.throughput and len(resumed.checkpoint.rows) == 6


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


def test_a_search_on_replayed_traffic_ranks_by_p99_from_the_config_as_built(served, tmp_path):
    """Each candidate answers the same 2 s of recorded arrivals (40 requests of digits_cnn, 1 to 3 rows, HTTP
    and gRPC); the config as built is measured first and reported beside the best."""
    from tpserve.common.traffic import RecordedInput, RecordedRequest, RecordingWriter

    repo = tmp_path / "repo"
    shutil.copytree(served.repo / "digits_cnn", repo / "digits_cnn")
    update_manifest(repo, read_manifest(served.repo)["models"]["digits_cnn"])
    with RecordingWriter(tmp_path / "recording") as writer:
        for i in range(40):
            rows = 1 + i % 3
            inputs = (RecordedInput("input", "FP32", (rows, 1, 8, 8)),)
            protocol = "grpc" if i % 2 else "http"
            writer.write(
                RecordedRequest(
                    arrival_us=1_000_000 + i * 50_000, model="digits_cnn", protocol=protocol, inputs=inputs, batch=rows
                )
            )
        writer.write(
            RecordedRequest(arrival_us=1_200_000, model="other_model", protocol="http", inputs=inputs, batch=1)
        )  # not this model's
    request = search.SearchRun(
        repo=repo,
        out=tmp_path / "out",
        variants=("digits_cnn",),
        mode="quick",
        budgets={"p99_ms": 1000.0, "accuracy": 0.01},
        measure={"replay": search.replay_workload(tmp_path / "recording", 1.0, 10.0, "")},
        max_instances=1,
        delays_us=(0, 1000),
        write_back=False,
    )
    text = search.run(request)
    assert "with the config as built (digits_cnn i2 d2000 p-)" in text
    results = json.loads((tmp_path / "out" / "search.json").read_text())["results"]
    assert len(results) >= 2 and all(r["feasible"] for r in results), results
    for replayed in (tmp_path / "out" / "raw").glob("replay-*/replay_results.jsonl"):
        assert len(replayed.read_text().splitlines()) == 1 + 40  # a header, then each request of digits_cnn
