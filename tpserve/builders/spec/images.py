"""Images to model input, as the spec's preprocessing says (used by calibration and the clients)."""

from __future__ import annotations

import numpy as np

from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import SpecError


def preprocess_image(image, spec: ModelSpec) -> np.ndarray:
    """A PIL image → one normalized sample in the spec's layout (no batch axis)."""
    pre, tensor = spec.preprocessing, spec.image_input
    if pre is None or tensor is None:
        raise SpecError(f"model {spec.name!r} has no image preprocessing in its spec; send a .npy instead")
    mode = "L" if pre.channels == 1 else "RGB"
    height, width = pre.image_size
    pixels = np.asarray(image.convert(mode).resize((width, height)), dtype=np.float32) / 255.0
    pixels = pixels.reshape(height, width, pre.channels)
    normalized = (pixels - np.array(pre.mean, np.float32)) / np.array(pre.std, np.float32)
    layout = normalized.transpose(2, 0, 1) if tensor.image_format == "NCHW" else normalized
    return np.ascontiguousarray(layout, dtype=np.float32)
