"""torchvision classifiers: ResNet-50 (the reference model) and ResNet-18 (small, for tests)."""

from __future__ import annotations

from tpserve.builders.spec.model_spec import ModelSpec, Preprocessing, TensorSpec
from tpserve.common.errors import SpecError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_WEIGHTS = {"resnet50": "ResNet50_Weights", "resnet18": "ResNet18_Weights"}


def _spec(arch: str, weights: str, max_batch_size: int, image_size: int) -> ModelSpec:
    return ModelSpec(
        name=arch if image_size == 224 else f"{arch}_{image_size}",
        builder="torchvision_classifier",
        builder_args={"arch": arch, "seed": 0},
        weights=weights,
        inputs=(TensorSpec("input", "FP32", (3, image_size, image_size), image_format="NCHW"),),
        outputs=(TensorSpec("logits", "FP32", (1000,)),),
        max_batch_size=max_batch_size,
        preprocessing=Preprocessing((image_size, image_size), 3, IMAGENET_MEAN, IMAGENET_STD),
        labels=_imagenet_labels(arch),
        validation_batch_sizes=(1, 2),
        # fp16 and bf16 atol from measurement: random-weight ResNet-50 logits have std 25 (max |x| 112); fp16
        # differs from fp32 by at most 0.05, bf16 by 0.58, top-1 unchanged (docs/benchmarks.md, compiled engines)
        tolerances={"fp32": (1e-3, 1e-3), "fp16": (1e-1, 2e-2), "bf16": (1.0, 5e-2), "int8": (2e-1, 2e-1)},
    )


def resnet50_spec(weights: str = "random", max_batch_size: int = 32, image_size: int = 224) -> ModelSpec:
    """ResNet-50 at 224x224; weights 'random' (default) or a torchvision name such as 'DEFAULT'."""
    return _spec("resnet50", weights, max_batch_size, image_size)


def resnet18_spec(weights: str = "random", max_batch_size: int = 16, image_size: int = 224) -> ModelSpec:
    """ResNet-18, the small ResNet the functional tests serve."""
    return _spec("resnet18", weights, max_batch_size, image_size)


def _imagenet_labels(arch: str) -> tuple[str, ...]:
    from torchvision import models

    return tuple(getattr(models, _WEIGHTS[arch]).DEFAULT.meta["categories"])


def build(model_spec: ModelSpec):
    """Build the torchvision network; load pretrained weights unless weights == 'random'."""
    import torch
    from torchvision import models

    arch = model_spec.builder_args["arch"]
    torch.manual_seed(model_spec.builder_args.get("seed", 0))
    weights = None if model_spec.weights == "random" else _weights_enum(arch, model_spec.weights)
    try:
        net = getattr(models, arch)(weights=weights)
    except (OSError, RuntimeError) as err:  # URLError is an OSError
        raise SpecError(
            f"could not load {arch} weights {model_spec.weights!r}: {err}; "
            "this host may have no route to the weights: use --weights random, or place the "
            "checkpoint in torch's hub cache ($TORCH_HOME/hub/checkpoints)"
        ) from err
    return net, {"weights": model_spec.weights}, None


def architecture(model_spec: ModelSpec):
    """The torchvision network without weights (they come from a state_dict)."""
    from torchvision import models

    return getattr(models, model_spec.builder_args["arch"])(weights=None)


def reference_data(model_spec: ModelSpec, samples: int = 64) -> dict:
    """Synthetic calibration images (uniform pixels, normalized): smoke-level only, no labels.

    Real INT8 deployments calibrate on their own images: --calibration DIR.
    """
    import numpy as np

    pre = model_spec.preprocessing
    assert pre is not None, f"{model_spec.name}: an image model has preprocessing"
    rng = np.random.default_rng(0)
    pixels = rng.random((samples, pre.channels, *pre.image_size), dtype=np.float32)
    mean = np.array(pre.mean, np.float32)[:, None, None]
    std = np.array(pre.std, np.float32)[:, None, None]
    return {"calibration": (pixels - mean) / std, "synthetic": True}


def _weights_enum(arch: str, name: str):
    from torchvision import models

    enum = getattr(models, _WEIGHTS[arch])
    try:
        return enum[name]
    except KeyError:
        raise SpecError(
            f"{arch}: weights {name!r} unknown; use 'random' or one of {[w.name for w in enum] + ['DEFAULT']}"
        ) from None
