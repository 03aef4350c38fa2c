"""The declaration a served model holds each request to (runtime/input_checks.py), written from the spec by the
builders: one message per fault, the in-process paths' wording for a value outside value_range."""

import numpy as np
import pytest

from tpserve.builders.repository.writer import input_checks
from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
from tpserve.common.errors import SpecError
from tpserve.triton_models.runtime.input_checks import InputChecks

SPEC = ModelSpec(
    name="topic",
    builder="factory",
    inputs=(
        TensorSpec("input_ids", "INT64", (-1,), axes=("seq",), value_range=(0, 1000)),
        TensorSpec("attention_mask", "INT64", (-1,), axes=("seq",), value_range=(0, 2)),
    ),
    outputs=(TensorSpec("logits", "FP32", (4,)),),
    max_batch_size=8,
    dynamic_axes={"seq": (1, 64)},
)


def _feed(ids, mask):
    return {"input_ids": np.array([ids], np.int64), "attention_mask": np.array([mask], np.int64)}


def test_each_fault_has_its_message_and_a_good_request_none():
    checks = InputChecks.from_json(input_checks(SPEC).to_json())
    assert checks.why_not(_feed([5, 6, 7], [1, 1, 0])) is None
    assert (
        checks.why_not(_feed([5, 1000], [1, 1]))
        == "input input_ids: values must lie in [0, 1000) (the model's value_range): row 0"
    )
    assert checks.why_not(_feed([1] * 65, [1] * 65)) == (
        "input_ids: 65 tokens per row exceed the model's longest length 64; truncate to 64 tokens"
    )
    assert checks.why_not(_feed([1, 2, 3], [1, 1])) == (
        "the inputs of one request must have one shape: input_ids [1, 3], attention_mask [1, 2]"
    )
    assert InputChecks.from_json("") is None


def test_a_batch_s_refusal_names_the_row_at_fault_and_the_mask_is_held_to_its_range():
    checks = InputChecks.from_json(input_checks(SPEC).to_json())
    ids = np.array([[5, 6], [7, 8], [9, 1000]], np.int64)
    mask = np.ones((3, 2), np.int64)
    assert checks.why_not({"input_ids": ids, "attention_mask": mask}).endswith("value_range): row 2")
    mask[1, 1] = 7  # a mask of 7 where [0, 2) is declared
    ids[2, 1] = 10
    assert checks.why_not({"input_ids": ids, "attention_mask": mask}) == (
        "input attention_mask: values must lie in [0, 2) (the model's value_range): row 1"
    )


def test_a_float_input_declared_finite_refuses_nan_and_infinity_naming_the_row():
    import torch

    from tpserve.triton_models.runtime.input_checks import torch_views

    spec = ModelSpec(
        name="tabular",
        builder="factory",
        inputs=(TensorSpec("features", "FP32", (4,), finite=True), TensorSpec("other", "FP32", (2,))),
        outputs=(TensorSpec("y", "FP32", (1,)),),
        max_batch_size=8,
    )
    checks = InputChecks.from_json(input_checks(spec).to_json())
    features, other = np.zeros((3, 4), np.float32), np.full((3, 2), np.nan, np.float32)  # other: not declared
    assert checks.why_not({"features": features, "other": other}) is None
    features[2, 1] = np.inf
    assert checks.why_not({"features": features, "other": other}) == (
        "input features: values must be finite (the model declares it: no NaN or infinity): row 2"
    )
    views = torch_views(["features"], [torch.from_numpy(features)])  # as the torch paths show a tensor: in place
    assert checks.why_not(views).endswith("row 2")
    with pytest.raises(SpecError, match="finite applies to float inputs"):
        TensorSpec("ids", "INT64", (4,), finite=True)


def test_a_float_range_is_closed_holds_nan_outside_and_names_the_row():
    import torch

    from tpserve.triton_models.runtime.input_checks import holds_floats, torch_views

    spec = ModelSpec(
        name="tabular",
        builder="factory",
        inputs=(TensorSpec("features", "FP32", (3,), value_range=(0, 1.5)), TensorSpec("n", "INT64", (1,))),
        outputs=(TensorSpec("y", "FP32", (1,)),),
        max_batch_size=8,
    )
    text = input_checks(spec).to_json()
    checks = InputChecks.from_json(text)
    features = np.array([[0, 1.5, 1], [0.5, 0.5, 0.5]], np.float32)  # both bounds inside
    assert checks.why_not({"features": features}) is None
    for bad in (1.5001, -0.1, np.nan, np.inf):
        features[1, 2] = bad
        assert checks.why_not({"features": features}) == (
            "input features: values must lie in [0, 1.5] (the model's value_range): row 1"
        ), bad
        assert checks.why_not(torch_views(["features"], [torch.from_numpy(features)])).endswith("row 1")
    assert holds_floats(text)
    assert not holds_floats(input_checks(SPEC).to_json())  # integer ranges and lengths: the native paths hold them


def test_a_bounded_float_input_warms_inside_its_range_and_a_uint8_wire_is_not_held_to_it():
    from tpserve.builders.repository.model_config import TensorConfig, Warmup
    from tpserve.builders.repository.writer import _warm_fill

    above = TensorSpec("x", "FP32", (2,), value_range=(1.0, 2.0))
    around = TensorSpec("y", "FP32", (2,), value_range=(-1.0, 1.0))
    assert above.warm_value() == 1.0 and around.warm_value() is None
    assert above.warms_with_zeros and around.warms_with_zeros and not TensorSpec("z", "FP32", (2,)).warms_with_zeros
    out = (TensorSpec("o", "FP32", (1,)),)
    spec = ModelSpec(name="two", builder="factory", inputs=(above, around), outputs=out, max_batch_size=4)
    inputs = [TensorConfig("x", "TYPE_FP32", (2,)), TensorConfig("y", "TYPE_FP32", (2,))]
    warm = Warmup("w", 1, inputs, _warm_fill(spec, inputs), ["x", "y"])
    assert np.frombuffer(warm.data_files()["w_x"], np.float32).tolist() == [1.0, 1.0]
    image = zoo_image_spec()
    assert "input" in input_checks(image).ranges
    assert input_checks(image, wire_uint8="input") is None


def zoo_image_spec():
    import dataclasses

    from tpserve.builders.spec import zoo

    spec = zoo.get_spec("resnet18", image_size=64, max_batch_size=4)
    return dataclasses.replace(spec, inputs=(dataclasses.replace(spec.inputs[0], value_range=(-10.0, 10.0)),))
