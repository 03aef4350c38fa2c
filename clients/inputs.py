"""Input tensors for a served model: random, from a .npy file, or from an image file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from builders.errors import ClientError
from builders.images import preprocess_image
from builders.spec import DTYPES, ModelSpec


def numpy_dtype(triton_dtype: str):
    """numpy dtype of a Triton datatype name as model metadata gives it (e.g. 'FP32')."""
    if triton_dtype not in DTYPES:
        raise ClientError(f"datatype {triton_dtype!r} is not supported by this client")
    return np.dtype(DTYPES[triton_dtype])


def random_input(shape: list[int], datatype: str, batch: int, seed: int = 0) -> np.ndarray:
    """Random data for a metadata shape (batch axis -1 first; other -1 axes become 8)."""
    rng = np.random.default_rng(seed)
    dims = [batch] + [8 if d == -1 else d for d in shape[1:]]
    dtype = numpy_dtype(datatype)
    if dtype.kind == "f":
        return rng.standard_normal(dims).astype(dtype)
    return rng.integers(0, 100, dims).astype(dtype)


def example_input(meta: dict, batch: int, seed: int = 0, spec: ModelSpec | None = None) -> np.ndarray:
    """An input that the model accepts: random numbers (within the spec's value_range and axis
    lengths where the model's spec is known), or for our pipelines' BYTES inputs a real payload
    (IMAGE: an encoded PNG of random pixels; TEXT: a sentence)."""
    tensor = _tensor_of(spec, meta)
    if tensor is not None:
        from builders.export import random_values, sample_shape

        return random_values(np.random.default_rng(seed), tensor, sample_shape(spec, tensor, batch))
    if meta["datatype"] != "BYTES":
        return random_input(meta["shape"], meta["datatype"], batch, seed)
    if meta["name"] == "IMAGE":
        payload = _random_png(seed)
    elif meta["name"] == "TEXT":
        payload = "Triton serves PyTorch models on CPUs and GPUs.".encode()
    else:
        raise ClientError(f"no example payload for BYTES input {meta['name']!r}; send one with --input")
    return np.array([[payload]] * batch, dtype=object)


def example_inputs(metas: list[dict], batch: int, spec: ModelSpec | None = None) -> dict:
    """example_input for every input of a model (metadata order), by name."""
    return {m["name"]: example_input(m, batch, i, spec) for i, m in enumerate(metas)}


def _tensor_of(spec: ModelSpec | None, meta: dict):
    """The spec's tensor behind a served input, if it has the same name, dtype and dims."""
    if spec is None:
        return None
    tensor = next((t for t in spec.inputs if t.name == meta["name"]), None)
    if tensor is None or tensor.dtype != meta["datatype"] or list(tensor.dims) != list(meta["shape"][1:]):
        return None
    return tensor


def _random_png(seed: int, size: int = 64) -> bytes:
    import io

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def load_npy(path: Path) -> np.ndarray:
    """A .npy file's array."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ClientError(f"could not read {path} as a .npy array: {err}") from err


def load_image(path: Path, spec: ModelSpec) -> np.ndarray:
    """An image file → a batch of one preprocessed sample."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return preprocess_image(image, spec)[None]
    except (OSError, UnidentifiedImageError) as err:
        raise ClientError(f"could not read {path} as an image: {err}") from err
