"""benchmarks/serving_bounds.py's repository edits: each tokenize layout a model of its own, its pipeline
pointing at it, the configs still what Triton parses."""

from benchmarks.serving_bounds import LAYOUTS, add_layouts
from builders.repository import pipelines
from builders.repository import writer as repository
from builders.repository.model_config import parse_pbtxt
from builders.spec import zoo


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
