"""digits_cnn: a small CNN trained at build time on scikit-learn's bundled digits data set."""

from __future__ import annotations

from tpserve.builders.spec.model_spec import ModelSpec, Preprocessing, TensorSpec

SEED = 0
EPOCHS = 30


def spec(weights: str = "random", max_batch_size: int = 64) -> ModelSpec:
    """The digits_cnn spec: 1x8x8 grey images (pixels scaled to [0, 1]) to 10 logits."""
    return ModelSpec(
        name="digits_cnn",
        builder="digits_cnn",
        builder_args={"seed": SEED, "epochs": EPOCHS},
        weights=weights,
        inputs=(TensorSpec("input", "FP32", (1, 8, 8), image_format="NCHW"),),
        outputs=(TensorSpec("logits", "FP32", (10,)),),
        max_batch_size=max_batch_size,
        preprocessing=Preprocessing(image_size=(8, 8), channels=1, mean=(0.5,), std=(0.5,)),
        labels=tuple(str(d) for d in range(10)),
        validation_batch_sizes=(1, 7, max_batch_size),
    )


def load_split(seed: int = SEED):
    """The digits data set as NCHW float32 in [0, 1], split 75/25 (train, test) by a fixed seed."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None, :, :]
    return train_test_split(images, data.target, test_size=0.25, random_state=seed, stratify=data.target)


def normalize(images, model_spec: ModelSpec):
    """Apply the spec's mean/std to images already scaled to [0, 1]."""
    pre = model_spec.preprocessing
    assert pre is not None, "digits_cnn has preprocessing"
    return ((images - pre.mean[0]) / pre.std[0]).astype("float32")


def architecture(model_spec: ModelSpec):
    """The untrained network (weights come from a state_dict)."""
    return _network()


def _network():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def build(model_spec: ModelSpec):
    """Train the CNN on the training split; return (module, metrics, held-out sample data)."""
    import torch

    seed, epochs = model_spec.builder_args["seed"], model_spec.builder_args["epochs"]
    torch.manual_seed(seed)
    x_train, x_test, y_train, y_test = load_split(seed)
    x_train, x_test = normalize(x_train, model_spec), normalize(x_test, model_spec)
    net = _network()
    _train(net, torch.from_numpy(x_train), torch.from_numpy(y_train).long(), epochs)
    accuracy = evaluate(net.eval(), x_test, y_test)
    metrics = {"accuracy": accuracy, "test_samples": len(y_test), "train_samples": len(y_train)}
    return net, metrics, {"x": x_test, "y": y_test, "calibration": x_train}


def reference_data(model_spec: ModelSpec) -> dict:
    """Held-out (x, y) and calibration inputs (the training split), without training."""
    x_train, x_test, _, y_test = load_split(model_spec.builder_args["seed"])
    return {"x": normalize(x_test, model_spec), "y": y_test, "calibration": normalize(x_train, model_spec)}


def _train(net, x, y, epochs: int) -> None:
    import torch

    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(SEED)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=generator).split(64):
            optimizer.zero_grad()
            loss_fn(net(x[idx]), y[idx]).backward()
            optimizer.step()


def evaluate(predict, x, y) -> float:
    """Top-1 accuracy of a callable (torch module or numpy function) on (x, y)."""
    import numpy as np
    import torch

    with torch.no_grad():
        out = predict(torch.from_numpy(x)) if isinstance(predict, torch.nn.Module) else predict(x)
    logits = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    return float((logits.argmax(axis=1) == y).mean())
