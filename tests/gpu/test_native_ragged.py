"""The in-process backend's native path for sequence models (triton_models/inprocess/native/ragged_path.c) on a GPU
host.

A small sentence encoder (BertModel, mean pooling inside the engine) and the same encoder answering token
embeddings, built compiled fp16 with CUDA graphs over the length grid and served in-process with dynamic
batching: the load says each instance took the native path; requests of mixed rows and lengths (masks with
padding among them) sent at once each get exactly their own rows (pooled: against the same engine through
Python's per-batch path; per token: against the eager fp32 module); requests that cannot be valid (a token id
outside value_range, inputs of two shapes, rows longer than the model's longest length) hear why and the next
is answered; CUDA shared memory is served on the same path. Once the server stops, its log counts the batches:
every batch ran natively and no execute entered Python."""

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: run on a GPU host"),
]

from tpserve.builders.build import build_model, build_torch_variant  # noqa: E402
from tpserve.builders.repository.writer import ServingOptions, TorchRuntime  # noqa: E402
from tpserve.builders.request import BuildRequest  # noqa: E402
from tpserve.builders.spec import spec_file  # noqa: E402
from tpserve.clients.infer import infer  # noqa: E402
from tpserve.clients.shared_memory import infer_cuda_shm  # noqa: E402
from tpserve.common.errors import ClientError  # noqa: E402
from tpserve.server.triton import launcher  # noqa: E402

ENCODERS = Path(__file__).parents[2] / "examples" / "text" / "encoders.py"
MODEL = """
[[model]]
name = "{name}"
factory = "encoders:bert"
factory_args = {{ hidden = 64, layers = 2, heads = 4, intermediate = 128 }}
python_path = ["."]
max_batch_size = 64
inputs = [
  {{ name = "input_ids", dtype = "INT64", dims = ["seq"], value_range = [1000, 2000] }},
  {{ name = "attention_mask", dtype = "INT64", dims = ["seq"], value_range = [0, 2] }},
]
outputs = [ {{ name = "{output}", dtype = "FP32", dims = {dims} }} ]
dynamic_axes = {{ seq = [1, 128] }}
{pooling}
validation_batch_sizes = [1, 4]
"""
SPECS = MODEL.format(name="pooled", output="embedding", dims="[64]", pooling='pooling = "mean"') + MODEL.format(
    name="tokens", output="last_hidden_state", dims='["seq", 64]', pooling=""
)
RUNTIME = dict(precision="fp16", cuda_graphs=True, compiler="inductor", host_outputs=True, inprocess=True)
# (rows, width, real lengths): a request's rows padded to its width, the mask marking each row's real tokens
REQUESTS = [(1, 32, [32]), (3, 40, [40, 7, 19]), (1, 5, [5]), (2, 128, [128, 64]), (5, 16, [16, 1, 3, 9, 12])]
REQUESTS += [(1, 9, [9]), (4, 70, [70, 33, 2, 51]), (1, 1, [1]), (2, 24, [24, 24]), (1, 100, [100])]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("native_ragged")
    (root / "models.toml").write_text(SPECS)
    (root / "encoders.py").write_text(ENCODERS.read_text())
    opts = ServingOptions(instances=1, kind="KIND_GPU", max_queue_delay_us=2000)
    names = {}
    for model in spec_file.load(root / "models.toml"):
        request = BuildRequest(spec=model.spec, target="embedded", repo=root / "scratch", work_dir=root / "work")
        build_model(request)
        for native in (True, False) if model.spec.name == "pooled" else (True,):
            request = BuildRequest(
                spec=model.spec, target="embedded", repo=root / "repo", work_dir=root / "work", options=opts
            )
            runtime = TorchRuntime(native=native, **RUNTIME)
            names[(model.spec.name, native)] = build_torch_variant(request, runtime)["name"]
    return root, names


def _request(rows: int, width: int, lengths: list[int], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 2000, (rows, width)).astype(np.int64)
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}  # padding: ids within value_range (checked too), mask 0


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _eager_tokens(root: Path, request: dict, lengths: list[int]) -> list[np.ndarray]:
    """Each row alone, at its real length, through the exported fp32 module."""
    from tpserve.triton_models.runtime.torch_runtime import load_program

    module = load_program(root / "work" / "tokens" / "model.pt2").float()
    rows = []
    with torch.inference_mode():
        for r, n in enumerate(lengths):
            out = module(*(torch.from_numpy(request[k][r : r + 1, :n]) for k in ("input_ids", "attention_mask")))
            rows.append((out[0] if isinstance(out, (tuple, list)) else out).float().numpy()[0])
    return rows


def test_sequence_models_are_served_natively_each_request_its_own_rows(served):
    root, names = served
    requests = [_request(rows, width, lengths, seed) for seed, (rows, width, lengths) in enumerate(REQUESTS)]
    pooled, python, tokens = names[("pooled", True)], names[("pooled", False)], names[("tokens", True)]
    with launcher.running(root / "repo", root / "state") as state:
        ep = state.endpoint("grpc")
        reference = [infer(ep, python, r).outputs["embedding"] for r in requests]
        with ThreadPoolExecutor(len(requests)) as pool:  # sent at once: the batcher groups them
            for _ in range(5):
                answers = list(pool.map(lambda r: infer(ep, pooled, r).outputs["embedding"], requests))
                for got, want in zip(answers, reference):
                    assert got.shape == want.shape and _cosines(got, want).min() > 0.9999
            token_answers = list(pool.map(lambda r: infer(ep, tokens, r).outputs["last_hidden_state"], requests))
        worst = 1.0
        for request, got, (rows, width, lengths) in zip(requests, token_answers, REQUESTS):
            assert got.shape == (rows, width, 64)
            for r, want in enumerate(_eager_tokens(root, request, lengths)):
                worst = min(worst, float(_cosines(got[r : r + 1, : lengths[r]], want[None])[0]))
        print(f"\nper-token outputs against eager fp32, each row alone: worst cosine {worst:.5f}")
        assert worst > 0.999
        _refusals(state, pooled, requests[0], reference[0])
        shm = infer_cuda_shm(ep, pooled, requests[1], {"embedding": (np.float32, (3, 64))})
        assert _cosines(shm["embedding"], reference[1]).min() > 0.9999
    text = "\n".join(p.read_text(errors="replace") for p in (root / "state").rglob("tritonserver.log"))
    for name in (pooled, tokens):
        assert f"{name} instance on cuda:0: per-batch path native" in text, text[-3000:]
    assert f"{python} instance on cuda:0: per-batch path Python (turned off" in text
    (counts,) = re.findall(
        rf"{pooled}: (\d+) batches \((\d+) requests\) served natively; (\d+) executes entered Python", text
    )
    batches, requests_served, entered = map(int, counts)
    assert requests_served >= 5 * len(REQUESTS) + 2 and batches < requests_served
    assert entered == 0  # no batch entered Python, the one in CUDA shared memory included


def _refusals(state, model: str, good: dict, expected: np.ndarray) -> None:
    http = state.endpoint("http")
    outside = {k: v.copy() for k, v in good.items()}
    outside["input_ids"][0, 3] = 2000
    with pytest.raises(ClientError, match=r"values must lie in \[1000, 2000\)"):
        infer(http, model, outside)
    two_shapes = {"input_ids": good["input_ids"], "attention_mask": good["attention_mask"][:, :-1]}
    with pytest.raises(ClientError, match=r"one shape"):
        infer(http, model, two_shapes)
    too_long = {k: np.ones((1, 129), np.int64) * (1000 if k == "input_ids" else 1) for k in good}
    with pytest.raises(ClientError, match=r"129 tokens per row exceed the model's longest length 128"):
        infer(http, model, too_long)
    again = infer(http, model, good).outputs["embedding"]
    assert _cosines(again, expected).min() > 0.9999
