"""The config-search space: candidates, neighbours, and the config a candidate becomes."""

from builders.repository import writer as repository
from builders.repository.model_config import parse_pbtxt
from builders.spec import zoo
from loadtest.search import Candidate, SearchSpace, candidate_config


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
    from builders.repository.model_config import parse_pbtxt
    from builders.repository.writer import ServingOptions, TorchRuntime, model_config, torch_config
    from builders.spec import zoo
    from loadtest.search import one_instance_only

    spec = zoo.get_spec("digits_cnn")
    gpu = ServingOptions(kind="KIND_GPU")
    assert one_instance_only(parse_pbtxt(torch_config(spec, TorchRuntime("fp16"), gpu).to_pbtxt()))
    assert not one_instance_only(parse_pbtxt(torch_config(spec, TorchRuntime("fp32"), ServingOptions()).to_pbtxt()))
    assert not one_instance_only(parse_pbtxt(model_config(spec, "embedded", gpu).to_pbtxt()))
