"""A newcomer's sentence encoder on a GPU host, first time, as typed: a spec file (transformers' BertModel, token
embeddings out, token ids declared from 1000, a 0/1 mask), `python -m tpserve.builders build --compiled fp16 --kind
KIND_GPU --inprocess`, `python -m tpserve.server start` with its defaults (the edge included; free ports), requests
of mixed
lengths sent at once, each answered with exactly its own rows (against the eager fp32 module). Run on a GPU host,
from the offline bundle with the edge's tarball extracted beside it."""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: run on a GPU host"),
]

ENCODERS = Path(__file__).parents[2] / "examples" / "text" / "encoders.py"
SPEC = """
[[model]]
name = "acme_encoder"
factory = "encoders:bert"
factory_args = { hidden = 64, layers = 2, heads = 4, intermediate = 128 }
python_path = ["."]
max_batch_size = 64
inputs = [
  { name = "input_ids", dtype = "INT64", dims = ["seq"], value_range = [1000, 2000] },
  { name = "attention_mask", dtype = "INT64", dims = ["seq"], value_range = [0, 2] },
]
outputs = [ { name = "last_hidden_state", dtype = "FP32", dims = ["seq", 64] } ]
dynamic_axes = { seq = [1, 128] }
validation_batch_sizes = [1, 4]
"""
LENGTHS = [3, 17, 64, 9, 128, 1, 40, 33, 5, 96, 12, 70]  # twelve requests of one sentence each


def _cli(*args, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tpserve.common import endpoints

    root = tmp_path_factory.mktemp("first_time")
    (root / "models.toml").write_text(SPEC)
    (root / "encoders.py").write_text(ENCODERS.read_text())
    build = ("tpserve.builders", "build", "--spec", "models.toml", "--repo", "repo", "--work-dir", "work")
    _cli(*build, "--compiled", "fp16", "--kind", "KIND_GPU", "--inprocess", cwd=root)
    http, grpc, metrics, health = endpoints.free_ports(4)
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    start = ("tpserve.server", "start", "--repo", "repo", *ports, "--health-port", str(health), "--state-dir", "state")
    printed = _cli(*start, cwd=root)
    try:
        yield root, endpoints.read_state(root / "state"), printed
    finally:
        _cli("tpserve.server", "stop", "--state-dir", "state", cwd=root)


def _engine(root: Path) -> str:
    models = json.loads((root / "repo" / "manifest.json").read_text())["models"]
    (name,) = [m for m in models if m.startswith("acme_encoder_inductor_fp16") and m.endswith("_inproc")]
    return name


def _request(length: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(1000, 2000, (1, length)).astype(np.int64),
        "attention_mask": np.ones((1, length), np.int64),
    }


def test_the_build_serves_with_the_defaults_edge_included(served):
    root, state, printed = served
    assert "edge: http" in printed, "make serve's default puts Envoy in front"
    engine = _engine(root)
    with state.endpoint("grpc", root / "repo").client() as client:
        assert client.is_model_ready(engine)
    left_out = state.left_out  # what cannot be served here says why (numpy 2: BYTES steps)
    assert all("numpy" in why or why.startswith("calls ") for why in left_out.values())


def test_mixed_lengths_sent_at_once_each_get_their_own_rows(served):
    from tpserve.clients.infer import infer
    from tpserve.triton_models.runtime.torch_runtime import load_program

    root, state, _ = served
    engine, ep = _engine(root), state.endpoint("grpc", root / "repo")
    requests = [_request(n, i) for i, n in enumerate(LENGTHS)]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda r: infer(ep, engine, r).outputs["last_hidden_state"], requests))
    reference = load_program(root / "work" / "acme_encoder" / "model.pt2").float()
    worst = 1.0
    for request, got in zip(requests, answers):
        with torch.inference_mode():
            out = reference(*(torch.from_numpy(request[k]) for k in ("input_ids", "attention_mask")))
        expected = (out[0] if isinstance(out, (tuple, list)) else out).float().numpy()
        assert got.shape == expected.shape
        flat_got, flat_expected = got.reshape(-1), expected.reshape(-1)
        cosine = float(flat_got @ flat_expected / np.linalg.norm(flat_got) / np.linalg.norm(flat_expected))
        worst = min(worst, cosine)
    print(f"\n{len(requests)} requests of lengths {LENGTHS} at once: worst cosine against eager fp32 {worst:.5f}")
    assert worst > 0.999
