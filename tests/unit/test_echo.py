"""echo_<model> (builders/spec/zoo/echo.py): another model's tensors, an engine that does nothing."""

import torch

from builders.spec import zoo
from builders.spec.zoo import echo


def test_the_echo_has_the_models_tensors_and_returns_its_first_input_values():
    model = zoo.get_spec("resnet18", image_size=32)
    twin = echo.spec_like(model)
    assert twin.name == "echo_resnet18_32" and twin.inputs == model.inputs and twin.outputs == model.outputs
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32)
    out = zoo.build_module(twin).module(x)
    assert out.shape == (2, 1000) and torch.equal(out, x.flatten(1)[:, :1000])
