"""An INT8 variant is gated on every output against FP32, with or without labels (builders/checks/agreement.py): one
that answers wrong is never written into the repository, and the build says which output missed, by how much,
against what, and what to try; one that passes carries every output's figures in the manifest."""

import json

import numpy as np
import pytest
import torch

from tpserve.builders.build import build_model
from tpserve.builders.checks import agreement
from tpserve.builders.repository import manifest
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import user_models
from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
from tpserve.builders.spec.zoo import BuiltModel
from tpserve.common.errors import SpecError, ValidationError


class IgnoresItsFirstFeature(torch.nn.Module):
    """A classifier whose first feature is a large value it ignores (its weights are zero: FP32 is exact)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(4, 16, generator=torch.Generator().manual_seed(0)))
            self.linear.weight[:, 0] = 0
            self.linear.bias.zero_()

    def forward(self, features):
        return self.linear(features)


class TwoOutputs(torch.nn.Module):
    """A tabular model: a score and class probabilities."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.hidden = torch.nn.Linear(16, 32)
        self.score = torch.nn.Linear(32, 1)
        self.probs = torch.nn.Linear(32, 3)
        with torch.no_grad():
            for layer in (self.hidden, self.score, self.probs):
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * 0.3)

    def forward(self, features):
        hidden = torch.relu(self.hidden(features))
        return self.score(hidden), torch.softmax(self.probs(hidden), dim=1)


def _spec(name, outputs, **extra) -> ModelSpec:
    return ModelSpec(
        name=name,
        builder=user_models.FACTORY,
        inputs=(TensorSpec(name="features", dtype="FP32", dims=(16,)),),
        outputs=outputs,
        max_batch_size=8,
        **extra,
    )


def _build(tmp_path, spec, module, features):
    np.savez(tmp_path / "calib.npz", features=features)
    request = BuildRequest(
        spec=spec,
        target="embedded",
        repo=tmp_path / "repo",
        work_dir=tmp_path / "work",
        precisions=("fp32", "int8"),
        calibration=tmp_path / "calib.npz",
    )
    return build_model(request, BuiltModel(module.eval()))


def test_an_int8_variant_that_answers_wrong_is_never_written_and_the_build_says_why(tmp_path):
    rows = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
    rows[:, 0] = np.random.default_rng(1).uniform(5e3, 1e4, 256)  # ignored, yet it sets the activation's scale
    spec = _spec("ignores_first", (TensorSpec(name="logits", dtype="FP32", dims=(4,)),))
    with pytest.raises(ValidationError) as refused:
        _build(tmp_path, spec, IgnoresItsFirstFeature(), rows)
    said = str(refused.value)
    assert "INT8 variant was not written" in said and "output 'logits' (class scores)" in said
    assert "top-1 agreement" in said and "vs at least 0.9" in said and "--calibration" in said
    assert not (tmp_path / "repo" / "ignores_first_int8").exists()  # never written; FP32 is
    assert set(manifest.read_manifest(tmp_path / "repo")["models"]) == {"ignores_first"}
    report = json.loads((tmp_path / "work" / "ignores_first" / "validation.int8.json").read_text())
    assert report["passed"] is False and report["outputs"][0]["top1"] < 0.9


def test_every_output_is_compared_and_recorded(tmp_path):
    rows = np.random.default_rng(2).standard_normal((256, 16)).astype(np.float32)
    outputs = (TensorSpec(name="score", dtype="FP32", dims=(1,)), TensorSpec(name="probs", dtype="FP32", dims=(3,)))
    _build(tmp_path, _spec("tabular", outputs), TwoOutputs(), rows)
    int8 = manifest.read_manifest(tmp_path / "repo")["models"]["tabular_int8"]["int8"]
    figures = {f["output"]: f for f in int8["outputs"]}
    assert set(figures) == {"score", "probs"} and int8["agreement_rows"] == "the calibration rows"
    assert figures["score"]["kind"] == "values" and figures["score"]["top1"] is None  # one value a row: no classes
    assert figures["probs"]["kind"] == "class scores" and figures["probs"]["top1"] >= 0.9
    assert all(f["passed"] and f["cosine"] >= 0.99 for f in figures.values())
    assert isinstance(int8["slower_than_fp32"], bool) and int8["int8_speedup"] > 0


def test_a_spec_may_hold_a_precision_to_other_figures():
    spec = _spec("held", (TensorSpec(name="y", dtype="FP32", dims=(3,)),), agreement={"int8": {"top1": 0.5}})
    reference = np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]
    candidate = np.eye(3, dtype=np.float32)[[0, 1, 1, 1]]  # half the rows' top class moved
    (loose,) = agreement.compare(spec, "int8", {"y": reference}, {"y": candidate})
    assert loose.top1 == 0.5 and not [m for m in loose.missed if "top-1" in m]
    (strict,) = agreement.compare(_spec("strict", spec.outputs), "int8", {"y": reference}, {"y": candidate})
    assert any("top-1 agreement 0.500 vs at least 0.9" in m for m in strict.missed)
    with pytest.raises(SpecError, match="agreement"):
        _spec("bad", spec.outputs, agreement={"int8": {"cosine": 2.0}})
