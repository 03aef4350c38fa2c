"""ONNX export (dynamic batch, checks, cache) and the Polygraphy validation gate."""

import json
import logging

import numpy as np
import pytest
import torch

from tpserve.builders.checks import validate
from tpserve.builders.formats import export
from tpserve.common.errors import ExportError, ValidationError


def test_export_has_a_dynamic_batch_axis_and_matches_torch(digits_build):
    import onnxruntime as ort

    spec, built, result = digits_build
    dims = export.onnx_tensor_dims(result.path)
    assert isinstance(dims["input"][0], str) and dims["input"][1:] == [1, 8, 8]
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    for batch in (1, 5, spec.max_batch_size):
        x = built.sample_data["x"][:batch]
        (got,) = session.run(None, {"input": x})
        with torch.no_grad():
            want = built.module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_the_export_records_the_module_metrics(digits_build):
    _, built, result = digits_build
    assert result.metrics["accuracy"] == built.metrics["accuracy"] > 0.5


def test_unchanged_inputs_reuse_the_export_and_changes_do_not(digits_build):
    _, _, result = digits_build
    out_dir = result.path.parent
    reused = export.up_to_date(out_dir, "session-hash")
    assert reused is not None and reused.reused and reused.sha256 == result.sha256
    assert export.up_to_date(out_dir, "another-hash") is None


def test_a_tampered_artifact_is_not_reused(digits_build, tmp_path):
    _, _, result = digits_build
    copy = tmp_path / "m"
    copy.mkdir()
    (copy / "model.onnx").write_bytes(result.path.read_bytes() + b"x")
    (copy / export.STAMP).write_text((result.path.parent / export.STAMP).read_text())
    assert export.up_to_date(copy, "session-hash") is None


def test_validation_report_is_written_and_passes(digits_build):
    spec, _, result = digits_build
    report = json.loads((result.path.parent / validate.REPORT).read_text())
    assert report["passed"] and report["model"] == spec.name
    assert [b["batch"] for b in report["batches"]] == list(spec.validation_batch_sizes)
    assert all(s["max_abs"] <= report["atol"] or s["passed"] for b in report["batches"] for s in b["outputs"].values())


def test_a_perturbed_model_fails_the_gate_and_says_why(digits_build, tmp_path):
    import copy

    spec, built, result = digits_build
    perturbed = copy.deepcopy(built.module)
    with torch.no_grad():
        perturbed[0].weight.add_(0.05)
    onnx_copy = tmp_path / "model.onnx"
    onnx_copy.write_bytes(result.path.read_bytes())
    with pytest.raises(ValidationError) as info:
        validate.validate(perturbed, onnx_copy, spec, sample_data=built.sample_data)
    message = str(info.value)
    for part in ("digits_cnn", "output 'logits'", "max abs error", "atol 0.0001", "rtol 0.001"):
        assert part in message
    assert json.loads((tmp_path / validate.REPORT).read_text())["passed"] is False


class _WrongOutputs(torch.nn.Module):
    def forward(self, x):
        return x.sum(dim=(1, 2, 3), keepdim=True), x.mean()


def test_an_export_that_does_not_match_the_spec_leaves_no_model(digits_build, tmp_path):
    spec, _, _ = digits_build
    with pytest.raises(ExportError):
        export.export_onnx(_WrongOutputs(), spec, tmp_path, "h")
    assert list(tmp_path.iterdir()) == []


def test_exporter_warnings_show_only_with_verbose(monkeypatch):
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with export.exporter_output():
            warnings.warn("the exporter talks", UserWarning, stacklevel=1)
        assert seen == []
        monkeypatch.setattr(logging.getLogger(export.LOG_NAME), "level", logging.DEBUG)
        with export.exporter_output():
            warnings.warn("the exporter talks", UserWarning, stacklevel=1)
        assert [str(w.message) for w in seen] == ["the exporter talks"]
