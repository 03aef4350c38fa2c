"""A user's own tabular model with two inputs and two outputs: `features` FP32 [6], declared finite and bounded to
[-5, 5], and `category` INT64 [1] in [0, 3); built from a spec file (ONNX Runtime on the embedded target, and its
compiled engine on the torch runtime) and served as `server start` serves it. Every declared bound is held on both
backends and both protocols, a refusal names the input, the bound and the row, and the good request beside it is
answered."""

import re

import numpy as np
import pytest

from tests.functional.conftest import served_variant, user_project_served
from tpserve.clients.infer import infer
from tpserve.common.errors import ClientError

pytestmark = pytest.mark.functional

MODULE = """
import torch


class Risk(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.embed = torch.nn.Embedding(3, 4)
        self.body = torch.nn.Linear(10, 8)
        self.score = torch.nn.Linear(8, 1)
        self.probs = torch.nn.Linear(8, 3)

    def forward(self, features, category):
        hidden = torch.relu(self.body(torch.cat([features, self.embed(category[:, 0])], dim=1)))
        return self.score(hidden), torch.softmax(self.probs(hidden), dim=1)


def build():
    return Risk()
"""
SPEC = """
[[model]]
name = "risk_tabular"
factory = "risk.model:build"
python_path = ["src"]
max_batch_size = 16
inputs  = [ { name = "features", dtype = "FP32", dims = [6], value_range = [-5, 5], finite = true },
            { name = "category", dtype = "INT64", dims = [1], value_range = [0, 3] } ]
outputs = [ { name = "score", dtype = "FP32", dims = [1] },
            { name = "probs", dtype = "FP32", dims = [3] } ]
"""


@pytest.fixture(scope="module")
def risk_served(tmp_path_factory):
    with user_project_served(tmp_path_factory.mktemp("risk_project"), "risk", MODULE, SPEC) as (state, repo, _):
        yield state, repo


def _rows(batch: int = 4) -> dict:
    rng = np.random.default_rng(batch)
    features = rng.uniform(-5, 5, (batch, 6)).astype(np.float32)
    features[0, :2] = (-5.0, 5.0)  # the bounds themselves are inside
    return {"features": features, "category": rng.integers(0, 3, (batch, 1)).astype(np.int64)}


@pytest.mark.parametrize("backend", ["onnxruntime", "compiled"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_declared_bound_is_held_naming_the_row_and_a_good_batch_is_answered(risk_served, protocol, backend):
    state, repo = risk_served
    ep, model = state.endpoint(protocol), served_variant(state, repo, "risk_tabular", backend)
    good = infer(ep, model, _rows())
    assert good.outputs["score"].shape == (4, 1) and good.outputs["probs"].shape == (4, 3)
    np.testing.assert_allclose(good.outputs["probs"].sum(axis=1), 1.0, rtol=1e-5)
    faults = {
        "features": (2, 5.25, re.escape("input features: values must lie in [-5, 5] (the model's value_range): row 2")),
        "category": (3, 3, re.escape("input category: values must lie in [0, 3) (the model's value_range): row 3")),
    }
    for name, (row, value, words) in faults.items():
        rows = _rows()
        rows[name][row, 0] = value
        with pytest.raises(ClientError, match=words):
            infer(ep, model, rows)
    rows = _rows()
    rows["features"][1, 4] = np.nan
    with pytest.raises(ClientError, match=r"input features: values must be finite .*: row 1"):
        infer(ep, model, rows)
    again = infer(ep, model, _rows())
    np.testing.assert_allclose(again.outputs["score"], good.outputs["score"], rtol=1e-5, atol=1e-6)
