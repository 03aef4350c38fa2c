"""benchmarks/serving_bounds.py's repository edits: each tokenize layout a model of its own, its pipeline
pointing at it, the configs still what Triton parses."""

from benchmarks.serving_bounds import LAYOUTS, add_layouts
from tpserve.builders.repository import pipelines
from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.model_config import parse_pbtxt
from tpserve.builders.spec import zoo


def test_every_layout_is_a_tokenize_step_and_a_pipeline_of_its_own(tmp_path):
    spec = zoo.get_spec("minilm")
    for config in pipelines.text_pipeline_configs(spec, repository.ServingOptions(), True, 2):  # as on a GPU
        (tmp_path / config.name).mkdir()
        (tmp_path / config.name / "config.pbtxt").write_text(config.to_pbtxt())
    names = add_layouts(tmp_path, spec.name, f"{spec.name}_pipeline")
    assert set(names) == set(LAYOUTS)
    for label, (instances, children) in LAYOUTS.items():
        step = parse_pbtxt((tmp_path / f"{spec.name}_tokenize_{label}" / "config.pbtxt").read_text())
        assert step.name == f"{spec.name}_tokenize_{label}"
        assert step.instance_group[0].count == instances
        assert step.parameters["tokenize_processes"].string_value == str(children)
        assert step.parameters["runtime"].string_value == "tokenize"
        pipeline = parse_pbtxt((tmp_path / names[label] / "config.pbtxt").read_text())
        assert pipeline.name == names[label]
        assert pipeline.ensemble_scheduling.step[0].model_name == f"{spec.name}_tokenize_{label}"


def test_a_queue_bound_is_written_where_the_spec_asks_and_none_by_default():
    """tritonserver 2.51's batcher misbehaves with a queue policy, so none by default; a spec's bound or timeout
    is written as config.pbtxt's default_queue_policy (REJECT)."""
    from tpserve.builders.repository.writer import QUEUE_PER_BATCH, ServingOptions, model_config

    spec = zoo.get_spec("resnet50")
    assert model_config(spec, "embedded").dynamic_batching.queue_policy is None
    derived = model_config(spec, "embedded", ServingOptions(max_queue_size=-1)).dynamic_batching.queue_policy
    assert derived.max_queue_size == QUEUE_PER_BATCH * spec.max_batch_size and derived.timeout_us == 0
    timed = model_config(spec, "embedded", ServingOptions(queue_timeout_ms=500)).dynamic_batching.queue_policy
    assert timed.timeout_us == 500_000 and timed.timeout_action == "REJECT" and timed.max_queue_size == 0


def test_a_queue_bound_that_cannot_be_is_refused_with_what_to_write():
    import pytest

    from tpserve.builders.repository.writer import ServingOptions
    from tpserve.common.errors import ConfigError

    with pytest.raises(ConfigError, match="max_queue_size >= 0"):
        ServingOptions(max_queue_size=-5)
