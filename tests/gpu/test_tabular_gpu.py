"""A user's tabular model with two inputs (features FP32 [16] declared finite in [-5, 5], a category INT64 [1] in
[0, 3)) and two outputs, on a GPU host as the quick start types it: `build --compiled fp16 --kind KIND_GPU
--inprocess`, then `server start` with its defaults. Both variants are served (the compiled engine under CUDA graphs,
one static buffer per input; ONNX Runtime whatever numpy the host has), answer as the fp32 eager module, and refuse a
NaN naming the row."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: run on a GPU host"),
]

MODULE = """
import torch


class Risk(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.embed = torch.nn.Embedding(3, 4)
        self.body = torch.nn.Linear(20, 32)
        self.score = torch.nn.Linear(32, 1)
        self.probs = torch.nn.Linear(32, 3)

    def forward(self, features, category):
        hidden = torch.relu(self.body(torch.cat([features, self.embed(category[:, 0])], dim=1)))
        return self.score(hidden), torch.softmax(self.probs(hidden), dim=1)


def build():
    return Risk()
"""
SPEC = """
[[model]]
name = "risk_tabular"
factory = "risk:build"
python_path = ["."]
max_batch_size = 16
inputs  = [ { name = "features", dtype = "FP32", dims = [16], value_range = [-5, 5], finite = true },
            { name = "category", dtype = "INT64", dims = [1], value_range = [0, 3] } ]
outputs = [ { name = "score", dtype = "FP32", dims = [1] }, { name = "probs", dtype = "FP32", dims = [3] } ]
"""


def _cli(*args, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tpserve.common import endpoints

    root = tmp_path_factory.mktemp("tabular")
    (root / "models.toml").write_text(SPEC)
    (root / "risk.py").write_text(MODULE)
    build = ("tpserve.builders", "build", "--spec", "models.toml", "--repo", "repo", "--work-dir", "work")
    _cli(*build, "--compiled", "fp16", "--kind", "KIND_GPU", "--inprocess", cwd=root)
    http, grpc, metrics, health = endpoints.free_ports(4)
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    _cli("tpserve.server", "start", "--repo", "repo", *ports, "--health-port", str(health), "--state-dir", "state",
         cwd=root)  # fmt: skip
    try:
        yield root, endpoints.read_state(root / "state")
    finally:
        _cli("tpserve.server", "stop", "--state-dir", "state", cwd=root)


def test_both_variants_answer_as_the_fp32_module_and_refuse_nan_naming_the_row(served):
    from tpserve.clients.infer import infer
    from tpserve.common.errors import ClientError

    root, state = served
    sys.path.insert(0, str(root))
    from risk import build  # the user's module, fp32 eager

    models = json.loads((root / "repo" / "manifest.json").read_text())["models"]
    engine = next(m for m in models if m.startswith("risk_tabular_inductor_fp16") and m.endswith("_inproc"))
    assert "nographs" not in engine  # CUDA graphs over both inputs
    assert not state.left_out  # ONNX Runtime served under the host's numpy as well
    rng = np.random.default_rng()
    rows = {"features": rng.uniform(-5, 5, (8, 16)).astype(np.float32), "category": rng.integers(0, 3, (8, 1))}
    with torch.no_grad():
        want = build().eval()(torch.from_numpy(rows["features"]), torch.from_numpy(rows["category"]))
    for model, tolerance in (("risk_tabular", 1e-4), (engine, 2e-2)):
        for protocol in ("http", "grpc"):
            got = infer(state.endpoint(protocol, root / "repo"), model, rows).outputs
            for name, expected in zip(("score", "probs"), want):
                np.testing.assert_allclose(got[name], expected.numpy(), atol=tolerance, rtol=tolerance)
            bad = {k: v.copy() for k, v in rows.items()}
            bad["features"][5, 3] = np.nan
            with pytest.raises(ClientError, match="input features: values must be finite .*row 5"):
                infer(state.endpoint(protocol, root / "repo"), model, bad)
