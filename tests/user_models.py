"""A user's own model package, written by the tests themselves: two inputs, two outputs.

`write_package(folder)` creates folder/src/acme_models (the module) and folder/weights/
(a full checkpoint and one with a key missing), as an ML engineer's checkout would hold them.
"""

from pathlib import Path

MODULE = '''
import torch
from torch import nn


class TwoHeads(nn.Module):
    """image (3x16x16 float) + token ids (variable length) -> class logits and an embedding."""

    def __init__(self, num_classes=5, vocab=50, width=8):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(2 * width, num_classes)
        self.proj = nn.Linear(2 * width, 8)

    def forward(self, image, ids):
        pooled = torch.relu(self.conv(image)).mean(dim=(2, 3))
        tokens = self.embed(ids).mean(dim=1)
        joint = torch.cat([pooled, tokens], dim=1)
        return self.head(joint), torch.tanh(self.proj(joint))


def build(num_classes=5, vocab=50):
    return TwoHeads(num_classes, vocab)


def broken(**kwargs):
    raise ValueError("the factory needs a config file that is not there")
'''

ACME = """
[[model]]
name = "acme_classifier"
factory = "acme_models.vision:build"
factory_args = { num_classes = 5 }
checkpoint = "weights/acme.pt"
python_path = ["src"]
max_batch_size = 8
inputs  = [ { name = "image", dtype = "FP32", dims = [3, 16, 16] },
            { name = "ids", dtype = "INT64", dims = ["seq"], value_range = [0, 50] } ]
outputs = [ { name = "logits", dtype = "FP32", dims = [5] },
            { name = "embedding", dtype = "FP32", dims = [8] } ]
dynamic_axes = { seq = [1, 24] }
"""


def write_package(folder: Path) -> Path:
    """The acme_models package and its checkpoints under folder; returns folder."""
    import torch

    package = folder / "src" / "acme_models"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "vision.py").write_text(MODULE)
    (folder / "weights").mkdir(exist_ok=True)
    torch.manual_seed(0)
    state = _load_module(folder).build(5).state_dict()
    torch.save(state, folder / "weights" / "acme.pt")
    torch.save({k: v for k, v in state.items() if k != "head.bias"}, folder / "weights" / "partial.pt")
    return folder


def build_reference(folder: Path):
    """The module with the checkpoint's weights, as the user's own code builds it (for comparisons)."""
    import torch

    module = _load_module(folder).build(5)
    module.load_state_dict(torch.load(folder / "weights" / "acme.pt", weights_only=True))
    return module.eval()


def _load_module(folder: Path):
    import importlib.util

    path = folder / "src" / "acme_models" / "vision.py"
    spec = importlib.util.spec_from_file_location(f"acme_vision_{abs(hash(str(folder)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
