"""Triton Python-backend model: the preprocess step of an image pipeline ensemble.

Input IMAGE: encoded image bytes (TYPE_STRING, one per sample) or, in the raw variant,
uint8 pixels (NHWC). Output: normalized float32 in the classifier's layout. Parameters:
image_size "H W", channels, mean, std, layout (NCHW|NHWC), max_pixels. A request whose image
cannot be decoded, or is too large, gets its own INVALID_ARG error naming this step; the
other requests of the batch are served.
"""

import io
import json

import numpy as np
import triton_python_backend_utils as pb_utils

STEP = "preprocess"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.height, self.width = (int(v) for v in params["image_size"].split())
        self.channels = int(params["channels"])
        self.mean = np.array([float(v) for v in params["mean"].split()], np.float32)
        self.std = np.array([float(v) for v in params["std"].split()], np.float32)
        self.layout = params.get("layout", "NCHW")
        self.max_pixels = int(params.get("max_pixels", str(4096 * 4096)))
        self.raw = config["input"][0]["data_type"] == "TYPE_UINT8"
        self.output_name = config["output"][0]["name"]

    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
        try:
            pixels = images.astype(np.float32) / 255.0 if self.raw else self._decode_all(images)
            tensor = pb_utils.Tensor(self.output_name, self._normalize(pixels))
            return pb_utils.InferenceResponse(output_tensors=[tensor])
        except ValueError as err:
            error = pb_utils.TritonError(f"{STEP}: {err}", pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)

    def _decode_all(self, images):
        return np.stack([self._decode(i, blob) for i, blob in enumerate(images.reshape(-1))])

    def _decode(self, index, blob):
        from PIL import Image

        if not blob:
            raise ValueError(f"image {index} is empty")
        try:
            with Image.open(io.BytesIO(blob)) as image:
                width, height = image.size
                if width * height > self.max_pixels:
                    raise ValueError(f"image {index} is {width}x{height}, over the limit of {self.max_pixels} pixels")
                image = image.convert("L" if self.channels == 1 else "RGB").resize((self.width, self.height))
                pixels = np.asarray(image, dtype=np.float32) / 255.0
        except Image.DecompressionBombError as err:  # a header claiming far more pixels than any limit
            raise ValueError(f"image {index} is over the limit of {self.max_pixels} pixels ({err})") from None
        except ValueError:
            raise
        except Exception as err:  # PIL raises many types on hostile bytes; each is the caller's bad image
            raise ValueError(f"image {index} could not be decoded ({type(err).__name__}: {err})") from None
        return pixels.reshape(self.height, self.width, self.channels)

    def _normalize(self, pixels):
        normalized = (pixels - self.mean) / self.std
        layout = normalized.transpose(0, 3, 1, 2) if self.layout == "NCHW" else normalized
        return np.ascontiguousarray(layout, dtype=np.float32)
