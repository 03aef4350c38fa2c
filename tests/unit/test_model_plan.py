"""Plans of models as a server describes them, and the inputs made from them (no server needed here)."""

import numpy as np
import pytest

from tpserve.clients.inputs import data_inputs, plan_inputs
from tpserve.clients.model_plan import ModelPlan, NotMeasurable, TensorPlan, parse_shapes
from tpserve.common.errors import ClientError

ADD_SUB = ModelPlan(
    name="add_sub",
    max_batch_size=0,
    inputs=(TensorPlan("A", "FP32", (4,)), TensorPlan("B", "FP32", (4,))),
    outputs=("S",),
)
DYNAMIC = ModelPlan(
    name="dyn",
    max_batch_size=8,
    inputs=(TensorPlan("X", "FP32", (-1,)), TensorPlan("M", "INT64", (2,), optional=True)),
    outputs=("Y",),
)


def test_no_batch_axis_where_max_batch_size_is_0():
    arrays = plan_inputs(ADD_SUB, batch=4)
    assert {k: v.shape for k, v in arrays.items()} == {"A": (4,), "B": (4,)}


def test_dynamic_dims_need_a_shape_and_optional_inputs_are_left_out():
    with pytest.raises(NotMeasurable, match="--shape X:8"):
        plan_inputs(DYNAMIC, batch=2)
    arrays = plan_inputs(DYNAMIC, batch=2, shapes=parse_shapes(["X:5"]))
    assert {k: v.shape for k, v in arrays.items()} == {"X": (2, 5)}
    with pytest.raises(ClientError, match="does not fit"):
        plan_inputs(DYNAMIC, batch=2, shapes={"X": [5, 5]})


def test_bytes_without_data_is_not_made_up():
    plan = ModelPlan(name="b", max_batch_size=8, inputs=(TensorPlan("PAYLOAD", "BYTES", (1,)),), outputs=("L",))
    with pytest.raises(NotMeasurable, match="--input-data"):
        plan_inputs(plan, batch=1)


def test_bad_shape_flags_are_refused():
    for bad in (["X"], ["X:a,b"], [":3"]):
        with pytest.raises(ClientError, match="NAME:d1,d2"):
            parse_shapes(bad)


@pytest.mark.parametrize(
    "dims, dtype, expected", [((16, 12, 3), "UINT8", (2, 16, 12, 3)), ((3, 16, 12), "FP32", (2, 3, 16, 12))]
)
def test_a_folder_of_images_feeds_an_image_input(tmp_path, dims, dtype, expected):
    from PIL import Image

    for i in range(2):
        Image.fromarray(np.full((30, 40, 3), 200 * i, np.uint8)).save(tmp_path / f"{i}.png")
    plan = ModelPlan(name="img", max_batch_size=4, inputs=(TensorPlan("image", dtype, dims),), outputs=("logits",))
    (array,) = data_inputs(tmp_path, plan).values()
    assert array.shape == expected and array.dtype == np.dtype("uint8" if dtype == "UINT8" else "float32")
    assert array.max() <= (255 if dtype == "UINT8" else 1.0) and array[1].min() > array[0].max()
