"""Optimization profiles from specs and the config rules they impose (no TensorRT needed)."""

import pytest

from tpserve.builders.formats.tensorrt_plans import plan_config, variant_name
from tpserve.builders.formats.tensorrt_profile import (
    EngineOptions,
    batch_range,
    check_config_against_profile,
    profile_shapes,
)
from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.model_config import parse_pbtxt
from tpserve.builders.spec import zoo
from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
from tpserve.common.errors import ConfigError


def test_dynamic_profile_spans_one_to_the_spec_max():
    spec = zoo.get_spec("resnet50", max_batch_size=64)
    shapes = profile_shapes(spec, EngineOptions())
    assert shapes["input"] == ((1, 3, 224, 224), (32, 3, 224, 224), (64, 3, 224, 224))


def test_static_profile_has_one_shape():
    spec = zoo.get_spec("resnet50")
    assert batch_range(spec, EngineOptions(static_batch=8)) == (8, 8, 8)


def test_sequence_axes_take_the_seq_len_range():
    spec = ModelSpec(
        name="enc",
        builder="x",
        inputs=[TensorSpec("ids", "INT64", (-1,))],
        outputs=[TensorSpec("h", "FP32", (-1, 384))],
        max_batch_size=16,
    )
    shapes = profile_shapes(spec, EngineOptions(seq_len=(4, 64, 256)))
    assert shapes["ids"] == ((1, 4), (8, 64), (16, 256))


def test_config_beyond_the_engine_max_says_how_to_fix_it():
    spec = zoo.get_spec("resnet50", max_batch_size=64)
    config = repository.model_config(spec, "ngc")
    with pytest.raises(ConfigError, match="engine max batch 32 < max_batch_size 64: rebuild with --max-batch 64"):
        check_config_against_profile(config, (1, 16, 32))


def test_preferred_sizes_outside_the_profile_are_refused():
    spec = zoo.get_spec("resnet50", max_batch_size=16)
    config = repository.model_config(spec, "ngc", repository.ServingOptions(preferred_batch_sizes=(2, 8)))
    with pytest.raises(ConfigError, match=r"preferred batch sizes \[2\] lie outside the engine profile 4..16"):
        check_config_against_profile(config, (4, 8, 16))


def test_plan_config_runs_on_the_gpu_with_per_architecture_files():
    spec = zoo.get_spec("resnet50")
    files = {"8.0": "model_sm80.plan", "9.0": "model_sm90.plan"}
    config = plan_config(spec, "resnet50_trt_fp16", EngineOptions(), repository.ServingOptions(instances=2), files)
    parsed = parse_pbtxt(config.to_pbtxt())
    assert parsed.platform == "tensorrt_plan" and parsed.max_batch_size == spec.max_batch_size
    assert dict(parsed.cc_model_filenames) == files
    assert parsed.instance_group[0].kind == parsed.instance_group[0].KIND_GPU and parsed.instance_group[0].count == 2


def test_static_and_dynamic_variants_have_distinct_names():
    spec = zoo.get_spec("resnet50")
    assert variant_name(spec, EngineOptions(precision="fp16")) == "resnet50_trt_fp16"
    assert variant_name(spec, EngineOptions(precision="fp16", static_batch=8)) == "resnet50_trt_fp16_static8"


def test_static_plan_config_fixes_the_batch_in_the_dims():
    spec = zoo.get_spec("resnet50")
    config = plan_config(spec, "r", EngineOptions(static_batch=8), repository.ServingOptions(), {"9.0": "m.plan"})
    parsed = parse_pbtxt(config.to_pbtxt())
    assert parsed.max_batch_size == 0 and list(parsed.input[0].dims) == [8, 3, 224, 224]
    assert not parsed.HasField("dynamic_batching")


def test_plan_config_with_a_profile_smaller_than_the_spec_is_an_error():
    spec = zoo.get_spec("resnet50", max_batch_size=64)
    with pytest.raises(ConfigError, match="rebuild with --max-batch 64"):
        plan_config(spec, "r", EngineOptions(max_batch=16), repository.ServingOptions(), {"9.0": "m.plan"})


def test_sequence_models_get_one_profile_per_length_bucket():
    from tpserve.builders.formats.tensorrt_profile import EngineOptions, length_profiles
    from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec

    seq = dict(axes=("seq",), value_range=(0, 30522))
    spec = ModelSpec(
        name="enc",
        builder="x",
        inputs=(TensorSpec("input_ids", "INT64", (-1,), **seq), TensorSpec("attention_mask", "INT64", (-1,), **seq)),
        outputs=(TensorSpec("embedding", "FP32", (384,)),),
        max_batch_size=256,
        dynamic_axes={"seq": (1, 256)},
    )
    profiles = length_profiles(spec, EngineOptions(seq_len=(1, 64, 256)))
    ids = [p["input_ids"] for p in profiles]
    assert [p[2][1] for p in ids] == [16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256]
    assert ids[0][0] == (1, 1) and ids[1][0] == (1, 17)  # length bands follow each other
    assert all(high[0] * high[1] <= 16384 and high[0] <= 256 for _, _, high in ids)  # the token budget
    assert all(p["attention_mask"] == p["input_ids"] for p in profiles)
