"""The tokenize step served by the in-process backend: no stub process, the server's own Python.

Selected by the config parameter runtime = "tokenize" on a `backend: "torch_inprocess"` model. TEXT arrives as
Triton's BYTES buffer and is parsed here (no numpy C-API in between, so any numpy serves it); the outputs are
written straight into the responses. The work itself is tokenize_core's, in child processes by default
(triton_models/runtime/tokenize_worker.py: outside the server's GIL, which the engine beside it needs). The config
parameter tokenize_processes says how many per instance (a batch is split between them; default 4 on 16 cores
or more; the pipeline runs two instances, builders/repository/pipelines.py); "0" keeps the work in here. A
batch of a few texts is tokenized here all the same: the pipe's two process wake-ups cost more than such a batch
holds the GIL (about 8 µs a text with the word cache).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from tpserve.triton_models.runtime.tokenize_core import STEP, load_tokenizer
from tpserve.triton_models.runtime.tokenize_worker import tokenize_raw

DEFAULT_PROCESSES = max(1, min(4, (os.cpu_count() or 2) // 4))  # children of one instance (tokenize_processes; 0: none)


class TokenizeServing:
    """What an in-process Instance runs for a tokenize model (the same faces as TorchServing's general path)."""

    staged = False
    IN_HERE_UP_TO = 4  # texts a batch: a batch this small is tokenized in the server's interpreter

    def __init__(self, config: dict, folder: str):
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.input_names = [i["name"] for i in config["input"]]
        if self.input_names != ["TEXT"]:
            raise ValueError(f"a tokenize model takes one input, TEXT; its config has {self.input_names}")
        self.name = config.get("name", STEP)
        path, length = os.path.join(folder, "tokenizer.json"), int(params.get("max_length", "256"))
        processes = _processes(params)
        self.tokenizer = load_tokenizer(path, length)  # first: a tokenizer that cannot load starts no child
        self.worker = None  # tokenize_worker: the work in child processes, outside the server's GIL
        if processes > 0:
            from tpserve.triton_models.runtime.tokenize_worker import TokenizePool

            self.worker = TokenizePool(path, length, processes)

    def read(self, view) -> tuple[bytes, int]:
        """A request's TEXT, from Triton's host buffers: the raw BYTES buffer and its element count (parsed where
        it is tokenized: here or in a child)."""
        if view.datatype != "BYTES":
            raise ValueError(f"{STEP}: TEXT is {view.datatype}, expected BYTES (strings)")
        if any(memory != 0 for _, _, memory, _ in view.chunks):
            raise ValueError(f"{STEP}: TEXT must come in host memory, not GPU memory")
        raw = b"".join(ctypes.string_at(address, size) for address, size, _, _ in view.chunks)
        return raw, int(np.prod(view.shape))

    def run(self, feeds: list) -> list:
        """Each request's (ids, mask) as int64 arrays (written into the responses as they lie), or the error that
        refuses it alone."""
        requests = [feed[0] for feed in feeds]
        if self.worker is None or sum(count for _, count in requests) <= self.IN_HERE_UP_TO:
            found = tokenize_raw(self.tokenizer, requests)
        else:
            found = self.worker.tokenize(requests)
        return [r if isinstance(r, Exception) else list(r) for r in found]

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def _processes(params: dict) -> int:
    """The config's tokenize_processes (tokenize_process, its old name, read too), checked."""
    text = params.get("tokenize_processes", params.get("tokenize_process", str(DEFAULT_PROCESSES)))
    if not text.strip().isdigit() or int(text) > 64:
        raise ValueError(f"{STEP}: parameter tokenize_processes is {text!r}: expected a whole number 0..64 (0: none)")
    return int(text)


def is_tokenize(config: dict) -> bool:
    """Whether an in-process model's config asks for the tokenize step."""
    return config.get("parameters", {}).get("runtime", {}).get("string_value") == "tokenize"
