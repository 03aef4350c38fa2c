"""The config-search space: candidates, neighbours, and the config a candidate becomes."""

from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.model_config import parse_pbtxt
from tpserve.builders.spec import zoo
from tpserve.loadtest.search import Candidate, SearchSpace, candidate_config


def _space():
    return SearchSpace(("m", "m_int8"), max_instances=2, delays_us=(0, 100, 1000), max_batch={"m": 16, "m_int8": 8})


def test_candidates_cover_the_bounded_space():
    candidates = _space().candidates()
    assert len(candidates) == 2 * 2 * 3 * 3
    assert all(max(c.preferred, default=0) <= {"m": 16, "m_int8": 8}[c.variant] for c in candidates)


def test_neighbours_move_one_step_along_one_axis():
    space = _space()
    start = Candidate("m", 1, 100, ())
    moves = space.neighbours(start)
    assert Candidate("m", 2, 100, ()) in moves and Candidate("m", 1, 0, ()) in moves
    assert Candidate("m", 1, 1000, ()) in moves and Candidate("m_int8", 1, 100, ()) in moves
    assert all(
        sum(getattr(n, a) != getattr(start, a) for a in ("variant", "instances", "delay_us", "preferred")) == 1
        for n in moves
    )


def test_candidate_config_changes_only_instances_and_batching():
    spec = zoo.get_spec("digits_cnn", max_batch_size=16)
    base = parse_pbtxt(repository.model_config(spec, "embedded").to_pbtxt())
    config = candidate_config(base, Candidate("digits_cnn", 2, 1000, (8,)))
    assert config.instance_group[0].count == 2 and config.instance_group[0].kind == base.instance_group[0].kind
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert config.input == base.input and config.backend == base.backend
    assert base.instance_group[0].count == 1  # the base is not modified


def test_gpu_torch_variants_are_searched_with_one_instance_only():
    space = SearchSpace(
        ("m_torch", "m"),
        max_instances=2,
        delays_us=(0,),
        max_batch={"m_torch": 8, "m": 8},
        single_instance=frozenset({"m_torch"}),
    )
    assert {c.instances for c in space.candidates() if c.variant == "m_torch"} == {1}
    assert {c.instances for c in space.candidates() if c.variant == "m"} == {1, 2}
    from_two = next(c for c in space.candidates() if c.variant == "m" and c.instances == 2)
    assert all(n.instances == 1 for n in space.neighbours(from_two) if n.variant == "m_torch")


def test_one_instance_only_flags_torch_runtime_on_gpu_not_onnx_or_cpu():
    from tpserve.builders.repository.model_config import parse_pbtxt
    from tpserve.builders.repository.writer import ServingOptions, TorchRuntime, model_config, torch_config
    from tpserve.builders.spec import zoo
    from tpserve.loadtest.search import one_instance_only

    spec = zoo.get_spec("digits_cnn")
    gpu = ServingOptions(kind="KIND_GPU")
    assert one_instance_only(parse_pbtxt(torch_config(spec, TorchRuntime(precision="fp16"), gpu).to_pbtxt()))
    assert not one_instance_only(
        parse_pbtxt(torch_config(spec, TorchRuntime(precision="fp32"), ServingOptions()).to_pbtxt())
    )
    assert not one_instance_only(parse_pbtxt(model_config(spec, "embedded", gpu).to_pbtxt()))


def test_a_config_as_built_off_the_grid_has_its_grid_neighbours():
    moves = _space().neighbours(Candidate("m", 3, 700, (4,)))
    assert Candidate("m", 3, 100, (4,)) in moves and Candidate("m", 3, 1000, (4,)) in moves
    assert Candidate("m", 2, 700, (4,)) in moves  # 3 instances: past the space's 2, one step down


def test_the_config_as_built_is_a_candidate():
    from tpserve.loadtest.search import as_built

    config = parse_pbtxt(
        'name: "m"\nmax_batch_size: 16\ninstance_group { count: 2 }\n'
        "dynamic_batching { max_queue_delay_microseconds: 700 preferred_batch_size: 8 }\n"
    )
    assert as_built(config, "m") == Candidate("m", 2, 700, (8,))


def test_on_a_replay_the_lowest_p99_wins_and_a_failed_request_disqualifies():
    from tpserve.loadtest.search import Result, _score

    fast = Result(Candidate("m", 1, 0, ()), 50.0, 4.0, True, objective="p99")
    slow_but_more = Result(Candidate("m", 2, 0, ()), 51.0, 9.0, True, objective="p99")
    failed = Result(Candidate("m", 1, 100, ()), 50.0, 1.0, False, "1 of the replay's requests failed", "p99")
    assert max([slow_but_more, failed, fast], key=_score) is fast
    assert _score(failed) < _score(slow_but_more)


def test_a_replay_workload_is_a_recording_or_a_fitted_file_narrowed_to_one_model(tmp_path):
    import pytest

    from tpserve.common.errors import MeasurementError
    from tpserve.loadtest.search import replay_workload

    (tmp_path / "workload.json").write_text("{}")
    recorded = replay_workload(tmp_path / "traffic", 3.0, 30.0, "m")
    assert (recorded.recording, recorded.speed, recorded.models, recorded.max_seconds) == (
        tmp_path / "traffic",
        3.0,
        ("m",),
        30.0,
    )
    fitted = replay_workload(tmp_path / "workload.json", 2.0, 30.0, [])
    assert (fitted.workload, fitted.scale, fitted.models) == (tmp_path / "workload.json", 2.0, ())
    with pytest.raises(MeasurementError, match="replay-seconds"):
        replay_workload(tmp_path / "traffic", 1.0, 0.0, "m")


def test_a_replay_narrowed_to_its_first_seconds_goes_to_the_target_without_its_bodies():
    from tpserve.common.traffic import RecordedInput
    from tpserve.loadtest.locust_suite.replay import Replay, _narrowed
    from tpserve.loadtest.workloads.recorded import ReplayItem

    shape = (RecordedInput("input", "FP32", (1, 4)),)
    items = [ReplayItem(t, "m", "1", "grpc", shape, {"body": "AAAA"}) for t in (0.0, 5.0, 12.0)]
    narrowed = _narrowed(items, Replay(max_seconds=10.0, target="m_int8"))
    assert [(i.offset_s, i.model, i.version, i.values) for i in narrowed] == [
        (0.0, "m_int8", "", None),
        (5.0, "m_int8", "", None),
    ]


def _runs():
    """Three repeated sweeps at concurrency 1 and 8 (rows as perf_analyzer's parse gives them)."""
    return [
        [{"level": 1, "throughput": 100.0 + d, "p99_ms": 2.0}, {"level": 8, "throughput": 400.0 + 10 * d, "p99_ms": p}]
        for d, p in ((0, 9.0), (2, 11.0), (-2, 10.0))
    ]


def test_repeats_become_medians_with_their_range_and_the_best_level_within_the_budget():
    from tpserve.loadtest.search import best_point, level_points

    points = level_points(_runs())
    assert [(p["level"], p["throughput"], p["p99_ms"]) for p in points] == [(1, 100.0, 2.0), (8, 400.0, 10.0)]
    assert (points[1]["low"], points[1]["high"]) == (380.0, 420.0) and points[1]["spread_pct"] == 10.0
    assert best_point(points, 50.0)["level"] == 8
    assert best_point(points, 5.0)["level"] == 1  # concurrency 8's p99 is over the budget
    assert best_point(points, 1.0)["level"] == 1  # none within: the lowest p99, judged infeasible


def test_candidates_within_the_winners_noise_are_named():
    from tpserve.loadtest.search import Result, within_noise

    best = Result(Candidate("m", 1, 0, ()), 400.0, 5.0, True, low=380.0, high=420.0)
    tied = Result(Candidate("m", 2, 0, ()), 370.0, 5.0, True, low=350.0, high=385.0)
    apart = Result(Candidate("m", 1, 100, ()), 300.0, 5.0, True, low=290.0, high=310.0)
    infeasible = Result(Candidate("m", 2, 100, ()), 410.0, 90.0, False, low=400.0, high=420.0)
    results = {r.candidate: r for r in (best, tied, apart, infeasible)}
    assert within_noise(results, best) == [tied]


def test_a_checkpoint_resumes_the_same_search_and_sets_aside_another(tmp_path):
    from tpserve.loadtest.search import Checkpoint, read_checkpoint

    path, settings = tmp_path / "checkpoint.jsonl", {"repo": "r", "measure": {"concurrency": (1, 8)}}
    first = Checkpoint(path, settings)
    first.add(Candidate("m", 1, 0, (8,)), {"throughput": 1.0, "p99_ms": 2.0})
    with open(path, "a") as handle:
        handle.write('{"label": "cut sh')  # a stop in the middle of a line
    again = Checkpoint(path, settings)
    assert again.get(Candidate("m", 1, 0, (8,)).label()) == {"throughput": 1.0, "p99_ms": 2.0}
    other = Checkpoint(path, {**settings, "measure": {"concurrency": (4,)}})
    assert other.get(Candidate("m", 1, 0, (8,)).label()) is None
    assert path.with_name("checkpoint.jsonl.old").exists() and len(read_checkpoint(path)) == 1
    assert Checkpoint(path, settings, resume=False).rows == {}


def test_a_checkpoint_is_judged_again_under_new_budgets_without_a_server(tmp_path):
    import json

    import pytest

    from tpserve.builders.repository.manifest import update_manifest
    from tpserve.common.errors import MeasurementError
    from tpserve.loadtest.search import Checkpoint, reanalyse

    (tmp_path / "repo").mkdir()
    update_manifest(tmp_path / "repo", {"name": "m", "accuracy": 0.99})
    with pytest.raises(MeasurementError, match="no search checkpoint"):
        reanalyse(tmp_path, tmp_path / "repo", {"p99_ms": 50.0, "accuracy": 0.01})
    checkpoint = Checkpoint(tmp_path / "checkpoint.jsonl", {"variants": ("m",)})
    fast = {"throughput": 300.0, "p99_ms": 4.0, "level": 1, "points": [], "low": 290.0, "high": 310.0}
    more = {"throughput": 500.0, "p99_ms": 20.0, "level": 8, "points": [], "low": 480.0, "high": 520.0}
    checkpoint.add(Candidate("m", 1, 0, ()), fast)
    checkpoint.add(Candidate("m", 2, 0, ()), more)
    assert "best: m i2 d0" in reanalyse(tmp_path, tmp_path / "repo", {"p99_ms": 50.0, "accuracy": 0.01})
    assert "best: m i1 d0" in reanalyse(tmp_path, tmp_path / "repo", {"p99_ms": 10.0, "accuracy": 0.01})
    assert json.loads((tmp_path / "search.json").read_text())["winner"] == "m i1 d0 p-"


def test_under_a_new_budget_a_swept_candidate_is_judged_at_the_level_within_it():
    from tpserve.loadtest.search import judge, level_points

    points = level_points(_runs())  # concurrency 1: 100/s at 2 ms; concurrency 8: 400/s at 10 ms
    row = {"throughput": 400.0, "p99_ms": 10.0, "level": 8, "points": points}
    loose = judge(Candidate("m", 1, 0, ()), row, {"p99_ms": 50.0, "accuracy": 1.0}, {}, ("m",))
    tight = judge(Candidate("m", 1, 0, ()), row, {"p99_ms": 5.0, "accuracy": 1.0}, {}, ("m",))
    assert (loose.level, loose.throughput, loose.feasible) == (8, 400.0, True)
    assert (tight.level, tight.throughput, tight.feasible) == (1, 100.0, True)
