"""Input tensors for a served model: random, from a .npy file, or from an image file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpserve.builders.spec.images import preprocess_image
from tpserve.builders.spec.model_spec import DTYPES, ModelSpec
from tpserve.common.errors import ClientError


def numpy_dtype(triton_dtype: str):
    """numpy dtype of a Triton datatype name as model metadata gives it (e.g. 'FP32')."""
    if triton_dtype not in DTYPES:
        raise ClientError(f"datatype {triton_dtype!r} is not supported by this client")
    return np.dtype(DTYPES[triton_dtype])


def bytes_payload(name: str, batch: int, seed: int = 0) -> np.ndarray:
    """A real payload for our pipelines' BYTES inputs (IMAGE: an encoded PNG of random pixels; TEXT: a sentence),
    one per sample."""
    if name == "IMAGE":
        payload = _random_png(seed)
    elif name == "TEXT":
        payload = "Triton serves PyTorch models on CPUs and GPUs.".encode()
    else:
        raise ClientError(f"no example payload for BYTES input {name!r}; send one with --input")
    return np.array([[payload]] * batch, dtype=object)


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


def plan_inputs(plan, batch: int, shapes: dict | None = None, spec: ModelSpec | None = None, seed: int = 0) -> dict:
    """Inputs a model accepts, made from its server-side plan (clients.model_plan): the request shape
    (no batch axis where max_batch_size is 0), dynamic dims from shapes or the manifest's spec, values from
    the spec where the model is ours; optional inputs left out.

    Without a spec, integers are drawn from the config's declared value_range (input_checks) or [0, 2) (valid as
    indices, masks and flags) and floats from a standard normal.

    Raises:
        NotMeasurable: a dynamic dim without a length, or a BYTES input without a known payload.
    """
    from tpserve.clients.model_plan import NotMeasurable

    arrays = {}
    for i, tensor in enumerate(t for t in plan.inputs if not t.optional):
        ours = _tensor_of(spec, {"name": tensor.name, "datatype": tensor.datatype, "shape": [-1, *tensor.dims]})
        lengths = (lambda name, pos, t=ours: spec.sample_length(t.dynamic_axes()[pos + 1])) if ours and spec else None
        shape = plan.shape(tensor, batch, shapes, lengths)
        if tensor.datatype == "BYTES":
            if tensor.name not in ("IMAGE", "TEXT"):
                raise NotMeasurable(
                    f"{plan.name}: BYTES input '{tensor.name}' needs real data: --input-data "
                    "(perf_analyzer JSON or an .npz with one array per input)"
                )
            arrays[tensor.name] = bytes_payload(tensor.name, batch, i)
            continue
        rng = np.random.default_rng(seed + i)
        if ours is not None:
            from tpserve.builders.formats.export import random_values

            arrays[tensor.name] = random_values(rng, ours, tuple(shape))
        else:
            declared = plan.checks.ranges.get(tensor.name) if plan.checks is not None else None
            arrays[tensor.name] = made_up_values(rng, numpy_dtype(tensor.datatype), shape, declared)
    return arrays


def made_up_values(rng, dtype, shape, value_range=None) -> np.ndarray:
    """Values for a tensor without a spec: floats from a standard normal, integers from the config's declared
    value_range where it has one, else from [0, 2) (valid as indices, masks and flags)."""
    dtype = np.dtype(dtype)
    low, high = value_range or (0, 2)
    values = rng.standard_normal(shape) if dtype.kind == "f" else rng.integers(low, max(high, low + 1), shape)
    return values.astype(dtype)


def data_inputs(path: Path, plan) -> dict:
    """The user's data for every required input: an .npz (one array per input, by name) or perf_analyzer's
    input-data JSON (its first entry: "content" with "shape", or "b64" for BYTES)."""
    import json

    required = [t.name for t in plan.inputs if not t.optional]
    if path.is_dir():
        arrays = image_folder(path, plan)
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    elif path.suffix == ".json":
        arrays = from_perf_entry(json.loads(path.read_text())["data"][0], plan)
    else:
        raise ClientError(f"--input-data {path}: expected an .npz, perf_analyzer's .json or a folder of images")
    missing = [n for n in required if n not in arrays]
    if missing:
        raise ClientError(f"{path} has no data for inputs {missing} of {plan.name}; it has {sorted(arrays)}")
    return {n: arrays[n] for n in arrays if n in {t.name for t in plan.inputs}}


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def image_folder(folder: Path, plan, limit: int = 64) -> dict:
    """A folder of images for a model's image input: a rank-3 input with 1 or 3 channels first (CHW) or last
    (HWC); each image resized to its dims; uint8 as they are, floats scaled to [0, 1]. One row per image
    (at most max_batch_size, and `limit`); without a batch axis, the first image."""
    from PIL import Image

    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)[:limit]
    images = [t for t in plan.inputs if len(t.dims) == 3 and (t.dims[0] in (1, 3) or t.dims[-1] in (1, 3))]
    if not files or len(images) != 1 or -1 in images[0].dims:
        raise ClientError(
            f"--input-data {folder}: needs images ({', '.join(IMAGE_SUFFIXES)}) and a model with one "
            "image input of fixed dims (C,H,W or H,W,C)"
        )
    tensor = images[0]
    last = tensor.dims[-1] in (1, 3)
    height, width, channels = tensor.dims if last else (*tensor.dims[1:], tensor.dims[0])
    rows = []
    for path in files[: max(plan.max_batch_size, 1)]:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L" if channels == 1 else "RGB").resize((width, height)))
        pixels = pixels.reshape(height, width, channels)
        rows.append(pixels if last else pixels.transpose(2, 0, 1))
    batch = np.stack(rows) if plan.batching else rows[0]
    dtype = numpy_dtype(tensor.datatype)
    return {tensor.name: batch.astype(dtype) if dtype.kind in "iu" else (batch / 255.0).astype(dtype)}


def from_perf_entry(entry: dict, plan) -> dict:
    """One entry of perf_analyzer's input data as arrays (a batch axis of 1 where the model batches)."""
    import base64
    import struct

    arrays = {}
    for tensor in plan.inputs:
        item = entry.get(tensor.name)
        if item is None:
            continue
        item = item if isinstance(item, dict) else {"content": item}
        shape = item.get("shape") or [len(item.get("content", []))]
        if "b64" in item:
            blob, values, at = base64.b64decode(item["b64"]), [], 0
            while at < len(blob):
                (size,) = struct.unpack_from("<I", blob, at)
                values.append(blob[at + 4 : at + 4 + size])
                at += 4 + size
            array = np.array(values, dtype=object).reshape(shape)
        else:
            array = np.array(item["content"], dtype=numpy_dtype(tensor.datatype)).reshape(shape)
        arrays[tensor.name] = array[None] if plan.batching else array  # perf_analyzer's shapes omit the batch
    return arrays
