"""A user's own small text model (issue 64's shape): its own package, ids in [0, 1000), a 0/1 mask, a `seq` axis
of 1..64, four labels; built from a spec file (ONNX Runtime, the embedded target) and served. Requests that cannot
be valid are refused before ONNX Runtime runs, with the in-process paths' messages, over HTTP and gRPC: an id
outside value_range, a length beyond the axis, ids and a mask of different lengths; a good request beside them is
answered."""

import re
import subprocess
import sys

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of
from tpserve.clients.infer import infer
from tpserve.common.errors import ClientError
from tpserve.server.triton import launcher

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
    root = tmp_path_factory.mktemp("topic_project")
    (root / "src" / "topic").mkdir(parents=True)
    (root / "src" / "topic" / "__init__.py").write_text("")
    (root / "src" / "topic" / "model.py").write_text(MODULE)
    (root / "models.toml").write_text(SPEC)
    command = [sys.executable, "-m", "tpserve.builders", "build", "--spec", "models.toml", "--target", "embedded"]
    built = subprocess.run([*command, "--repo", "repo"], cwd=root, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    with launcher.running(root / "repo", root / "state") as state:
        yield state, root / "repo"


def _tokens(length: int) -> dict:
    ids = np.random.default_rng(length).integers(0, 1000, (1, length)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((1, length), np.int64)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_that_cannot_be_valid_are_refused_with_why_and_a_good_one_is_answered(topic_served, protocol):
    state, repo = topic_served
    ep = endpoint_of(state, repo, protocol)
    assert infer(ep, "topic_textcls", _tokens(12)).outputs["logits"].shape == (1, 4)
    outside = _tokens(12)
    outside["input_ids"][0, 0] = 30000  # a BERT wordpiece, not one of this model's ids
    bad = {
        "values must lie in [0, 1000) (the model's value_range)": outside,
        "axis 'seq' has length 100; the model takes 1..64": _tokens(100),
        "share axis 'seq' but have lengths 8 and 6": {**_tokens(8), "attention_mask": np.ones((1, 6), np.int64)},
    }
    for why, arrays in bad.items():
        with pytest.raises(ClientError, match=re.escape(why)):
            infer(ep, "topic_textcls", arrays)
    assert infer(ep, "topic_textcls", _tokens(64)).outputs["logits"].shape == (1, 4)  # the server stayed up
