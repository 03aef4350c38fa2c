"""The model zoo: specs by name, and the builders that make their torch modules."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.builders.spec.zoo import digits, echo, text, vision
from tpserve.common.errors import SpecError

_SPECS = {
    "digits_cnn": digits.spec,
    "resnet50": vision.resnet50_spec,
    "resnet18": vision.resnet18_spec,
    "minilm": text.spec,
}
_BUILDERS = {
    "digits_cnn": digits.build,
    "torchvision_classifier": vision.build,
    "sentence_encoder": text.build,
    "echo": echo.build,
}
_ARCHITECTURES = {
    "digits_cnn": digits.architecture,
    "torchvision_classifier": vision.architecture,
    "sentence_encoder": text.architecture,
    "echo": echo.architecture,
}
_REFERENCE_DATA = {
    "digits_cnn": digits.reference_data,
    "torchvision_classifier": vision.reference_data,
}


@dataclass
class BuiltModel:
    """A torch module in eval mode, with metrics the builder measured (e.g. accuracy)."""

    module: Any  # a torch.nn.Module
    metrics: dict = field(default_factory=dict)
    sample_data: dict | None = None


def available() -> list[str]:
    """Names of the models in the zoo."""
    return sorted(_SPECS)


def get_spec(name: str, **overrides) -> ModelSpec:
    """The spec of a zoo model, with keyword overrides (e.g. weights="DEFAULT").

    Raises:
        SpecError: the name is not in the zoo, or an override is invalid.
    """
    if name not in _SPECS:
        raise SpecError(f"model {name!r} is not in the zoo; available: {', '.join(available())}")
    return _SPECS[name](**{k: v for k, v in overrides.items() if v is not None})


def build_module(spec: ModelSpec) -> BuiltModel:
    """Build the torch module of a spec through its registered builder (a zoo one or a user model's)."""
    from tpserve.builders.spec import user_models

    if spec.builder in user_models.USER_BUILDERS:
        module, metrics, sample = user_models.build(spec)
        return BuiltModel(module, metrics, sample)
    if spec.builder not in _BUILDERS:
        raise SpecError(f"model {spec.name!r}: builder {spec.builder!r} is unknown; known: {sorted(_BUILDERS)}")
    module, metrics, sample = _BUILDERS[spec.builder](spec)
    return BuiltModel(module.eval(), metrics, sample)


def architecture(spec: ModelSpec):
    """The spec's network without trained weights, in eval mode (load a state_dict into it)."""
    if spec.builder not in _ARCHITECTURES:
        raise SpecError(f"model {spec.name!r}: builder {spec.builder!r} has no architecture for the torch runtime")
    return _ARCHITECTURES[spec.builder](spec).eval()


def reference_data(spec: ModelSpec) -> dict:
    """Data for INT8 work without building the module: 'calibration', and 'x', 'y' where labeled."""
    func = _REFERENCE_DATA.get(spec.builder)
    return func(spec) if func else {}


def builder_source_hash(spec: ModelSpec) -> str:
    """sha256 of the source of the module that holds the spec's builder (part of the build hash)."""
    import hashlib

    from tpserve.builders.spec import user_models

    if spec.builder in user_models.USER_BUILDERS:
        return user_models.source_hash(spec)
    func = _BUILDERS.get(spec.builder)
    module = inspect.getmodule(func) if func else None
    source = inspect.getsource(module) if module else ""
    return hashlib.sha256(source.encode()).hexdigest()
