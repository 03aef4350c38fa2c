"""echo_<model> (builders/spec/zoo/echo.py): another model's tensors, an engine that does nothing."""

import torch

from tpserve.builders.spec import zoo
from tpserve.builders.spec.zoo import echo


def test_the_echo_has_the_models_tensors_and_returns_its_first_input_values():
    model = zoo.get_spec("resnet18", image_size=32)
    twin = echo.spec_like(model)
    assert twin.name == "echo_resnet18_32" and twin.inputs == model.inputs and twin.outputs == model.outputs
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32)
    out = zoo.build_module(twin).module(x)
    assert out.shape == (2, 1000) and torch.equal(out, x.flatten(1)[:, :1000])


def test_a_sequence_models_echo_answers_its_first_token_in_the_outputs_shapes():
    from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec

    seq = dict(axes=("seq",), value_range=(0, 100))
    inputs = (TensorSpec("input_ids", "INT64", (-1,), **seq), TensorSpec("attention_mask", "INT64", (-1,), **seq))
    for outputs, expected in (
        ((TensorSpec("embedding", "FP32", (8,)),), [(3, 8)]),
        ((TensorSpec("last_hidden_state", "FP32", (-1, 4), axes=("seq",)),), [(3, 5, 4)]),
    ):
        model = ModelSpec(
            name="enc", builder="x", inputs=inputs, outputs=outputs, max_batch_size=8, dynamic_axes={"seq": (1, 16)}
        )
        module = zoo.build_module(echo.spec_like(model)).module
        ids = torch.arange(15).reshape(3, 5)
        out = module(ids, torch.ones_like(ids))
        assert out.shape == expected[0] and out.dtype == torch.float32
        assert torch.equal(out.reshape(3, -1)[:, 0], ids[:, 0].float())
