"""A user's own small text model: its own package, ids in [0, 1000), a 0/1 mask, a `seq` axis of 1..64, four
labels; built from a spec file (ONNX Runtime, the embedded target, and its compiled engine on the torch runtime)
and served. Requests that cannot be valid are refused before the model runs, with the in-process paths' messages,
over HTTP and gRPC, on both backends: an id outside value_range, a length beyond the axis, ids and a mask of
different lengths, a wrong datatype or rank; a good request beside them is answered. perf and Locust measure it
with their defaults and with the user's own rows (INPUT_DATA), without one failure, and refuse data that cannot
fit before measuring."""

import csv
import importlib.util
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of, served_variant, user_project_served
from tpserve.clients.infer import infer
from tpserve.common.errors import ClientError

pytestmark = pytest.mark.functional

MODULE = """
import torch


class Topics(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.embed = torch.nn.Embedding(1000, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled)


def build():
    return Topics()
"""
SPEC = """
[[model]]
name = "topic_textcls"
factory = "topic.model:build"
python_path = ["src"]
max_batch_size = 16
inputs  = [ { name = "input_ids", dtype = "INT64", dims = ["seq"], value_range = [0, 1000] },
            { name = "attention_mask", dtype = "INT64", dims = ["seq"], value_range = [0, 2] } ]
outputs = [ { name = "logits", dtype = "FP32", dims = [4] } ]
dynamic_axes = { seq = [1, 64] }
labels = ["sport", "tech", "arts", "news"]
"""


@pytest.fixture(scope="module")
def topic_served(tmp_path_factory):
    """Built, then served as `make serve` serves it: `server start`'s default front, on free ports."""
    with user_project_served(tmp_path_factory.mktemp("topic_project"), "topic", MODULE, SPEC) as served:
        yield served


BACKENDS = ["onnxruntime", "compiled"]  # ONNX Runtime; torch.compile on the torch runtime (with CUDA graphs on a GPU)


def _served(state, repo, backend: str) -> str:
    return served_variant(state, repo, "topic_textcls", backend)


def _measured(state, repo) -> str:
    """The ONNX Runtime model where it is served, else the compiled one."""
    names = [n for n in ("topic_textcls",) if n not in state.left_out]
    return names[0] if names else _served(state, repo, "compiled")


def _tokens(length: int, dtype=np.int64) -> dict:
    ids = np.random.default_rng(length).integers(0, 1000, (1, length)).astype(dtype)
    return {"input_ids": ids, "attention_mask": np.ones((1, length), dtype)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_that_cannot_be_valid_are_refused_with_why_and_a_good_one_is_answered(topic_served, protocol, backend):
    state, repo, _ = topic_served
    model = _served(state, repo, backend)
    ep = endpoint_of(state, repo, protocol)
    assert infer(ep, model, _tokens(12)).outputs["logits"].shape == (1, 4)
    outside = _tokens(12)
    outside["input_ids"][0, 0] = 30000  # a BERT wordpiece, not one of this model's ids
    wrong_type = {**_tokens(8), "input_ids": _tokens(8)["input_ids"].astype(np.int32)}
    bad = {  # what the answer must say (a pattern)
        re.escape("values must lie in [0, 1000) (the model's value_range)"): outside,
        re.escape("100 tokens per row exceed the model's longest length 64; truncate to 64 tokens"): _tokens(100),
        re.escape("must have one shape: input_ids [1, 8], attention_mask [1, 6]"): {
            **_tokens(8),
            "attention_mask": np.ones((1, 6), np.int64),
        },
        # datatype and rank: the edge refuses them on HTTP, Triton's own check on gRPC, before any backend runs;
        # either names the input at fault and what the model takes
        "input_ids.*INT32.*INT64": wrong_type,
        r"(input_ids|attention_mask).*\[1, ?1, ?8\]": {k: v[None] for k, v in _tokens(8).items()},
    }
    for why, arrays in bad.items():
        with pytest.raises(ClientError, match=why):
            infer(ep, model, arrays)
    assert infer(ep, model, _tokens(64)).outputs["logits"].shape == (1, 4)  # the server stayed up


def _loadtest(state, out, *args, model="topic_textcls") -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tpserve.loadtest", *args, "--models", model, "--state-dir", str(state)]
    return subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=600)


def _locust_failures(out) -> int:
    with open(out / "locust_stats.csv", newline="") as handle:
        return sum(int(row["Failure Count"]) for row in csv.DictReader(handle) if row["Name"] == "Aggregated")


def _rows(tmp_path) -> list[str]:
    ids = np.random.default_rng(0).integers(0, 1000, (64, 20)).astype(np.int64)
    np.savez(tmp_path / "rows.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    return ["--input-data", str(tmp_path / "rows.npz")]


@pytest.mark.parametrize("given", ["declared", "rows"])
def test_perf_measures_it_from_its_declaration_and_from_the_users_rows_without_a_failure(topic_served, tmp_path, given):
    served, repo, state = topic_served
    data = _rows(tmp_path) if given == "rows" else []
    out = tmp_path / "perf"
    perf = _loadtest(
        state, out, "perf", "--concurrency", "1 2", "--interval-ms", "500", *data, model=_measured(served, repo)
    )
    assert perf.returncode == 0, perf.stdout[-3000:] + perf.stderr[-3000:]
    assert json.loads((out / "failed.json").read_text()) == []
    assert len((out / "perf.csv").read_text().splitlines()) == 3  # header, c1, c2


@pytest.mark.parametrize("given", ["declared", "rows"])
def test_locust_measures_it_from_its_declaration_and_from_the_users_rows_without_a_failure(
    topic_served, tmp_path, given
):
    if importlib.util.find_spec("locust") is None:
        pytest.skip("Locust is not installed here (the offline bundle for GPU hosts leaves it out)")
    served, repo, state = topic_served
    data = _rows(tmp_path) if given == "rows" else []
    out = tmp_path / "locust"
    locust = _loadtest(state, out, "locust", "--run-time", "4", "--users", "2", *data, model=_measured(served, repo))
    assert locust.returncode == 0, locust.stdout[-3000:] + locust.stderr[-3000:]
    assert _locust_failures(out) == 0


def test_rows_that_cannot_fit_are_refused_before_anything_is_measured(topic_served, tmp_path):
    served, repo, state = topic_served
    model = _measured(served, repo)
    ids = np.full((8, 12), 30000, np.int64)  # BERT's wordpieces, not this model's ids
    np.savez(tmp_path / "bert.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    for tool in ("perf", "locust") if importlib.util.find_spec("locust") else ("perf",):
        run = _loadtest(state, tmp_path / tool, tool, "--input-data", str(tmp_path / "bert.npz"), model=model)
        assert run.returncode != 0
        assert "row 0: input input_ids: values must lie in [0, 1000)" in run.stdout + run.stderr
