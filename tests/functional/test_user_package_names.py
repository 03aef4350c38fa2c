"""A user's packages may bear the generic names ours once had: `common`, `server`, `clients`, `utils`. The project
installs one import package (tpserve), so a spec whose factory is `common.vision:build` with those packages beside
it in src/ builds through the `tpserve` command and serves the model's own numbers (before: "cannot import
'common.vision' (ModuleNotFoundError)", since our `common` was found first)."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of
from tpserve.clients.infer import infer
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional

PACKAGES = {
    "common/__init__.py": "",
    "common/vision.py": (
        "import torch\n"
        "from clients import WIDTH\n"
        "from server import SCALE\n"
        "from utils import bias\n\n"
        "class Scaled(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        torch.manual_seed(5)\n"
        "        self.linear = torch.nn.Linear(WIDTH, 3)\n\n"
        "    def forward(self, x):\n"
        "        return self.linear(x) * SCALE + bias()\n\n"
        "def build():\n"
        "    return Scaled()\n"
    ),
    "clients/__init__.py": "WIDTH = 4\n",
    "server/__init__.py": "SCALE = 2.0\n",
    "utils/__init__.py": "def bias():\n    return 0.5\n",
}
SPEC = """
[[model]]
name = "named_like_ours"
factory = "common.vision:build"
python_path = ["src"]
max_batch_size = 4
inputs  = [ { name = "x", dtype = "FP32", dims = [4] } ]
outputs = [ { name = "y", dtype = "FP32", dims = [3] } ]
"""


def test_a_users_common_server_clients_and_utils_build_and_serve(tmp_path):
    for name, text in PACKAGES.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_text(text)
    (tmp_path / "models.toml").write_text(SPEC)
    command = ["tpserve", "build", "--spec", "models.toml", "--target", "embedded", "--repo", "repo"]
    built = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=_path_env())
    assert built.returncode == 0, built.stdout + built.stderr
    import sys

    sys.path.insert(0, str(tmp_path / "src"))
    try:
        import torch
        from common.vision import build  # the user's, as the build imported it

        x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
        with torch.no_grad():
            expected = build()(torch.from_numpy(x)).numpy()
    finally:
        sys.path.remove(str(tmp_path / "src"))
        for name in ("common.vision", "common", "clients", "server", "utils"):
            sys.modules.pop(name, None)
    with launcher.running(tmp_path / "repo", tmp_path / "state") as state:
        answer = infer(endpoint_of(state, tmp_path / "repo", "grpc"), "named_like_ours", {"x": x})
    np.testing.assert_allclose(answer.outputs["y"], expected, rtol=1e-4, atol=1e-5)


def _path_env() -> dict:
    """This interpreter's folder first on PATH: the `tpserve` command of this environment."""
    import os
    import sys

    return {**os.environ, "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))}
