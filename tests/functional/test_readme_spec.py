"""The README's spec file, as written, builds: a package like a user's (acme_models.vision:build and a
checkpoint) beside it, then the command `make build-engines SPEC=models.toml` runs (`python -m tpserve.builders build`),
and the repository holds the model with the README's tensors."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional
ROOT = Path(__file__).parents[2]
VISION = """
import torch


def build():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 5),
    )
"""


def _readme_spec() -> str:
    section = (ROOT / "README.md").read_text().split("## Serve your own model", 1)[1]
    return re.search(r"```toml\n(.*?)```", section, re.S).group(1)


def _forget_acme() -> None:
    for name in [m for m in sys.modules if m == "acme_models" or m.startswith("acme_models.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_the_readme_spec_builds(tmp_path):
    import torch

    package = tmp_path / "src" / "acme_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "vision.py").write_text(VISION)
    _forget_acme()  # another test of this process may have imported a package of that name from elsewhere
    sys.path.insert(0, str(tmp_path / "src"))
    try:
        from acme_models.vision import build

        (tmp_path / "weights").mkdir()
        torch.save(build().state_dict(), tmp_path / "weights" / "acme.pt")
    finally:
        sys.path.remove(str(tmp_path / "src"))
        _forget_acme()
    (tmp_path / "models.toml").write_text(_readme_spec())
    command = [sys.executable, "-m", "tpserve.builders", "build", "--spec", "models.toml", "--models", "", "--target"]
    command += ["embedded", "--repo", str(tmp_path / "repo")]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    config = (tmp_path / "repo" / "acme_classifier" / "config.pbtxt").read_text()
    assert 'name: "image"' in config and 'name: "logits"' in config and "max_batch_size: 16" in config
