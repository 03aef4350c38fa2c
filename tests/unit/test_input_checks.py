"""The declaration a served model holds each request to (runtime/input_checks.py), written from the spec by the
builders: one message per fault, the in-process paths' wording for a value outside value_range."""

import numpy as np

from tpserve.builders.repository.writer import input_checks
from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
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
        == "input input_ids: values must lie in [0, 1000) (the model's value_range)"
    )
    assert checks.why_not(_feed([1] * 65, [1] * 65)) == (
        "input_ids: 65 tokens per row exceed the model's longest length 64; truncate to 64 tokens"
    )
    assert checks.why_not(_feed([1, 2, 3], [1, 1])) == (
        "the inputs of one request must have one shape: input_ids [1, 3], attention_mask [1, 2]"
    )
    assert InputChecks.from_json("") is None
