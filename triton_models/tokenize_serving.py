"""The tokenize step served by the in-process backend: no stub process, the server's own Python.

Selected by the config parameter runtime = "tokenize" on a `backend: "torch_inprocess"` model. TEXT arrives as
Triton's BYTES buffer and is parsed here (no numpy C-API in between, so any numpy serves it); the outputs are
written straight into the responses. The work itself is tokenize_core's: one encode_batch per dynamic batch.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import torch

from triton_models.tokenize_core import STEP, load_tokenizer, parse_bytes, tokenize


class TokenizeServing:
    """What an in-process Instance runs for a tokenize model (the same faces as TorchServing's general path)."""

    staged = False

    def __init__(self, config: dict, folder: str):
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.tokenizer = load_tokenizer(os.path.join(folder, "tokenizer.json"), int(params.get("max_length", "256")))
        self.input_names = [i["name"] for i in config["input"]]
        if self.input_names != ["TEXT"]:
            raise ValueError(f"a tokenize model takes one input, TEXT; its config has {self.input_names}")
        self.name = config.get("name", STEP)

    def read(self, view) -> np.ndarray:
        """A request's TEXT, from Triton's host buffers, as an object array of bytes."""
        if view.datatype != "BYTES":
            raise ValueError(f"{STEP}: TEXT is {view.datatype}, expected BYTES (strings)")
        if any(memory != 0 for _, _, memory, _ in view.chunks):
            raise ValueError(f"{STEP}: TEXT must come in host memory, not GPU memory")
        raw = b"".join(ctypes.string_at(address, size) for address, size, _, _ in view.chunks)
        return parse_bytes(raw, int(np.prod(view.shape)))

    def run(self, feeds: list, steps=None) -> list:
        """Each request's (ids, mask) as torch tensors, or the error that refuses it alone."""
        texts = [feed[0] for feed in feeds]
        return [
            r if isinstance(r, Exception) else [torch.from_numpy(a) for a in r] for r in tokenize(self.tokenizer, texts)
        ]


def is_tokenize(config: dict) -> bool:
    """Whether an in-process model's config asks for the tokenize step."""
    return config.get("parameters", {}).get("runtime", {}).get("string_value") == "tokenize"
