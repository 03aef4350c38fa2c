"""Triton Python-backend model: the tokenize step of a text pipeline.

Input TEXT (TYPE_STRING, one per sample); outputs input_ids and attention_mask (int64, each request padded to
its own longest text). The config batches requests dynamically: the texts of every request in a batch are
decoded together (numpy, no loop per text) and tokenized in one Rust `encode_batch` call, which spreads the
texts over the tokenizer's threads. tokenizer.json sits in the version folder. Parameter: max_length.
An empty, whitespace-only or non-UTF-8 text gets INVALID_ARG for its request alone, naming this step.
Outputs leave through DLPack (config parameter dlpack_outputs), which the stub reads whatever numpy is
installed: the embedded server's stub, built for numpy 1, sends arrays it is handed directly empty under numpy 2.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

STEP = "tokenize"
torch = None  # imported in initialize: the stub starts faster, unit tests import this module without it


class TritonPythonModel:
    def initialize(self, args):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        global torch
        import torch  # outputs leave as torch tensors through DLPack (the stub takes numpy's capsules badly)
        from tokenizers import Tokenizer

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.enable_truncation(int(params.get("max_length", "256")))
        self.tokenizer.enable_padding()
        self.names = [o["name"] for o in config["output"]]  # ids, then mask: the encoder's input names

    def execute(self, requests):
        texts = [pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy().reshape(-1) for r in requests]
        decoded, errors = decode_requests(texts)
        good = [i for i, e in enumerate(errors) if e is None]
        arrays = self._encode([decoded[i] for i in good])
        responses = [None] * len(requests)
        for i, error in enumerate(errors):
            if error is not None:
                err = pb_utils.TritonError(f"{STEP}: {error}", pb_utils.TritonError.INVALID_ARG)
                responses[i] = pb_utils.InferenceResponse(output_tensors=[], error=err)
        for i, (ids, mask) in zip(good, arrays):
            tensors = [pb_utils.Tensor.from_dlpack(n, torch.from_numpy(a)) for n, a in zip(self.names, (ids, mask))]
            responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
        return responses

    def _encode(self, per_request: list) -> list:
        """One encode_batch over every request's texts; each request's rows cut to its own longest text."""
        if not per_request:
            return []
        encodings = self.tokenizer.encode_batch(np.concatenate(per_request).tolist())
        ids = np.array([e.ids for e in encodings], np.int64)
        mask = np.array([e.attention_mask for e in encodings], np.int64)
        out, start = [], 0
        for texts in per_request:
            rows = slice(start, start + len(texts))
            width = max(int(mask[rows].sum(axis=1).max()), 1)
            out.append((np.ascontiguousarray(ids[rows, :width]), np.ascontiguousarray(mask[rows, :width])))
            start += len(texts)
        return out


def decode_requests(texts: list) -> tuple[list, list]:
    """Per request, its texts as str (all requests decoded in one numpy call), or why the request is refused."""
    try:
        decoded = _decode(np.concatenate(texts) if texts else np.array([], object))
    except ValueError:  # one request's text is bad: find which, the others go on
        return _decode_each(texts)
    out, start = [], 0
    for t in texts:
        out.append(decoded[start : start + len(t)])
        start += len(t)
    return out, [_empty(d) for d in out]


def _decode_each(texts: list) -> tuple[list, list]:
    decoded, errors = [], []
    for t in texts:
        try:
            decoded.append(_decode(t))
            errors.append(_empty(decoded[-1]))
        except ValueError as err:
            decoded.append(np.array([], str))
            errors.append(str(err))
    return decoded, errors


def _decode(flat) -> np.ndarray:
    """bytes (or str) array -> str array, in one numpy call."""
    if len(flat) == 0:
        return np.array([], str)
    if flat.dtype.kind == "U" or not isinstance(flat[0], bytes):
        return flat.astype(str)
    try:
        return np.char.decode(flat.astype(np.bytes_), "utf-8")
    except UnicodeDecodeError:  # the slow path only for a bad request: say which text
        for index, raw in enumerate(flat):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"text {index} is not valid UTF-8 ({err})") from None
        raise


def _empty(texts: np.ndarray):
    """Why a request's texts are refused (an empty or whitespace-only one), or None."""
    if len(texts) == 0:
        return "the request holds no text"
    blank = np.flatnonzero(np.char.str_len(np.char.strip(texts)) == 0)
    return f"text {blank[0]} is empty or whitespace only" if len(blank) else None
