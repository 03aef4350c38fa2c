"""Configs written through model_config_pb2 parse back to the same message."""

import pytest

from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.model_config import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    TensorConfig,
    parse_pbtxt,
)
from tpserve.builders.spec import zoo


def _config(**overrides):
    fields = dict(
        name="m",
        backend="python",
        max_batch_size=8,
        inputs=[TensorConfig("input", "TYPE_FP32", (3, 4, 4), "FORMAT_NCHW")],
        outputs=[TensorConfig("logits", "TYPE_FP32", (10,), label_filename="labels.txt")],
        dynamic_batching=DynamicBatching((4, 8), 250),
        instance_groups=[InstanceGroup(2, "KIND_CPU")],
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def test_pbtxt_round_trips_through_the_protobuf_parser():
    config = _config()
    parsed = parse_pbtxt(config.to_pbtxt())
    assert parsed == config.to_proto()
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4, 8]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 250
    assert parsed.instance_group[0].count == 2
    assert parsed.output[0].label_filename == "labels.txt"


def test_max_batch_size_zero_is_written_explicitly():
    text = _config(max_batch_size=0, dynamic_batching=None).to_pbtxt()
    assert "max_batch_size: 0" in text
    assert parse_pbtxt(text).max_batch_size == 0


@pytest.mark.parametrize(
    "target,field,value", [("embedded", "backend", "python"), ("ngc", "platform", "onnxruntime_onnx")]
)
def test_zoo_configs_per_target(target, field, value):
    spec = zoo.get_spec("digits_cnn")
    options = repository.ServingOptions(instances=3, preferred_batch_sizes=(8, 16))
    parsed = parse_pbtxt(repository.model_config(spec, target, options).to_pbtxt())
    assert getattr(parsed, field) == value
    assert parsed.max_batch_size == spec.max_batch_size
    assert list(parsed.input[0].dims) == [1, 8, 8]
    assert parsed.instance_group[0].count == 3
    assert parsed.model_warmup[0].batch_size == 1
    assert parsed.version_policy.latest.num_versions == 1


def test_unknown_target_is_refused():
    with pytest.raises(Exception, match="target 'tpu' is unknown"):
        repository.model_config(zoo.get_spec("digits_cnn"), "tpu")


def test_no_dynamic_batching_option_drops_the_batcher():
    config = repository.model_config(
        zoo.get_spec("digits_cnn"), "embedded", repository.ServingOptions(dynamic_batching=False)
    )
    assert not parse_pbtxt(config.to_pbtxt()).HasField("dynamic_batching")


@pytest.mark.parametrize(
    "model, target, options, count",
    [
        ("minilm", "embedded", repository.ServingOptions(), 2),  # a sequence model on the CPU: two instances
        ("minilm", "embedded", repository.ServingOptions(instances=1), 1),  # asked for: as asked
        ("minilm", "embedded", repository.ServingOptions(instances=3), 3),
        ("minilm", "embedded", repository.ServingOptions(kind="KIND_GPU"), 1),
        ("minilm", "ngc", repository.ServingOptions(), 1),  # Triton's own ONNX Runtime backend
        ("digits_cnn", "embedded", repository.ServingOptions(), 1),  # not a sequence model
    ],
)
def test_instances_default_to_two_for_a_sequence_model_on_the_cpu(model, target, options, count):
    config = repository.model_config(zoo.get_spec(model), target, options)
    assert parse_pbtxt(config.to_pbtxt()).instance_group[0].count == count


def test_the_torch_runtimes_cpu_default_stays_one_instance():
    runtime = repository.TorchRuntime(precision="fp32", cuda_graphs=False, compiler="inductor", inprocess=True)
    config = repository.torch_config(zoo.get_spec("minilm"), runtime, repository.ServingOptions())
    assert parse_pbtxt(config.to_pbtxt()).instance_group[0].count == 1


def test_ragged_batching_can_be_turned_off_for_the_onnx_model_only():
    spec = zoo.get_spec("minilm")
    ragged = parse_pbtxt(repository.model_config(spec, "embedded").to_pbtxt())
    assert all(i.allow_ragged_batch for i in ragged.input)
    off = repository.ServingOptions(ragged_batching=False)
    same_shapes = parse_pbtxt(repository.model_config(spec, "embedded", off).to_pbtxt())
    assert not any(i.allow_ragged_batch for i in same_shapes.input)
    assert same_shapes.instance_group[0].count == 2  # the instance layout stays
    runtime = repository.TorchRuntime(precision="fp32", cuda_graphs=False, compiler="inductor", inprocess=True)
    with pytest.raises(Exception, match="ragged_batching off applies to the ONNX Runtime model only"):
        repository.torch_config(spec, runtime, off)


def test_warmup_honours_value_ranges_and_gives_masks_real_tokens(tmp_path):
    """Token ids from 1000 and a 0/1 mask: the warmup reads ids of 1000 and a mask of ones from files under
    warmup/ (zeros would be refused ids, and a mask of no real token), written beside the config."""
    import dataclasses

    import numpy as np

    from tpserve.builders.spec.model_spec import TensorSpec

    spec = zoo.get_spec("minilm")
    ids = TensorSpec("input_ids", "INT64", (-1,), axes=("seq",), value_range=(1000, 2000))
    mask = TensorSpec("attention_mask", "INT64", (-1,), axes=("seq",), value_range=(0, 2))
    spec = dataclasses.replace(spec, inputs=(ids, mask))
    config = repository.model_config(spec, "embedded", repository.ServingOptions())
    (warmup,) = config.warmup
    assert warmup.fill == {"input_ids": 1000, "attention_mask": 1}
    text = config.to_pbtxt()
    assert 'input_data_file: "random_batch_1_input_ids"' in text and "zero_data" not in text
    repository.write_model(tmp_path, spec, config, {}, "embedded")
    data = np.frombuffer((tmp_path / spec.name / "warmup" / "random_batch_1_input_ids").read_bytes(), np.int64)
    assert data.tolist() == [1000] * 8  # one sample of the 8 tokens the warmup sends; Triton repeats it per batch
    assert parse_pbtxt((tmp_path / spec.name / "config.pbtxt").read_text()).model_warmup[0].inputs["input_ids"]


def test_generated_masks_are_prefixes_of_real_tokens():
    import numpy as np

    from tpserve.builders.formats.export import random_values
    from tpserve.builders.spec.model_spec import TensorSpec

    mask = TensorSpec("attention_mask", "INT64", (-1,), value_range=(0, 2))
    rows = random_values(np.random.default_rng(1), mask, (64, 12))
    lengths = rows.sum(axis=1)
    assert lengths.min() >= 1 and lengths.max() <= 12 and len(set(lengths.tolist())) > 3
    assert all(row[:n].all() and not row[n:].any() for row, n in zip(rows, lengths))  # ones, then zeros
    assert not TensorSpec("attention_mask", "INT64", (-1,), value_range=(5, 9)).is_mask  # a range without 0/1


def test_the_in_process_tokenize_step_runs_two_instances_beside_a_gpu_engine_and_one_beside_a_cpu_one(tmp_path):
    from tpserve.builders.repository import pipelines

    spec = zoo.get_spec("minilm")
    for kind, count in (("KIND_GPU", 2), ("KIND_CPU", 1)):
        text = f'name: "{spec.name}"\nbackend: "torch_inprocess"\ninstance_group {{\n  count: 1\n  kind: {kind}\n}}\n'
        (tmp_path / "config.pbtxt").write_text(text)
        instances = pipelines.tokenize_instances(tmp_path / "config.pbtxt")
        assert instances == count, kind
        step = pipelines.text_pipeline_configs(spec, repository.ServingOptions(), True, instances)[0]
        assert step.name.endswith("_tokenize") and step.backend == repository.INPROCESS_BACKEND
        assert [(g.count, g.kind) for g in step.instance_groups] == [(count, "KIND_CPU")]
    stub = pipelines.text_pipeline_configs(spec, repository.ServingOptions(instances=3), inprocess=False)[0]
    assert [g.count for g in stub.instance_groups] == [3]
