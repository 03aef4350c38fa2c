"""INT8 by explicit quantization (QDQ): accuracy gate, activation types per target, calibration sources."""

import json

import numpy as np
import onnx
import pytest

from tpserve.builders.build import build_model
from tpserve.builders.formats import quantize
from tpserve.builders.repository import manifest
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import zoo
from tpserve.common.errors import SpecError, ValidationError


def _zero_point_types(path):
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    types = set()
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2:
            types.add(onnx.helper.tensor_dtype_to_np_dtype(inits[node.input[2]].data_type).name)
    return types


@pytest.fixture(scope="module")
def calibration(digits_build):
    spec, _, _ = digits_build
    return quantize.calibration_data(spec, None, zoo.reference_data(spec)["calibration"])


@pytest.mark.parametrize("for_tensorrt,zero_point", [(False, "uint8"), (True, "int8")])
def test_int8_stays_within_one_point_of_fp32(digits_build, calibration, tmp_path, for_tensorrt, zero_point):
    spec, _, fp32 = digits_build
    result = quantize.quantize(fp32.path, tmp_path / "int8.onnx", spec, calibration, for_tensorrt=for_tensorrt)
    assert _zero_point_types(result.path) == {zero_point}
    data = zoo.reference_data(spec)
    fp32_acc = quantize.onnx_accuracy(fp32.path, data["x"], data["y"], "input")
    int8_acc = quantize.onnx_accuracy(result.path, data["x"], data["y"], "input")
    assert fp32_acc - int8_acc <= 0.01, (fp32_acc, int8_acc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int8.onnx"]  # no partial or pre-processed leftovers


def test_the_gate_refuses_a_large_drop_and_writes_its_report(digits_build, tmp_path):
    spec, _, _ = digits_build
    with pytest.raises(ValidationError, match="INT8 held-out accuracy 0.9000 trails FP32 0.9900"):
        quantize.accuracy_gate(spec, 0.99, 0.90, tmp_path / "r.json", {})
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False
    assert quantize.accuracy_gate(spec, 0.99, 0.985, tmp_path / "r.json", {})["passed"]


def test_calibration_sources(digits_build, tmp_path):
    from PIL import Image

    spec, _, _ = digits_build
    np.save(tmp_path / "bad.npy", np.zeros((4, 3, 8, 8), np.float32))
    with pytest.raises(SpecError, match=r"shape \[4, 3, 8, 8\] does not fit input 'input'"):
        quantize.calibration_data(spec, tmp_path / "bad.npy", None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="holds no .png"):
        quantize.calibration_data(spec, tmp_path / "empty", None)
    with pytest.raises(SpecError, match="no default calibration data"):
        quantize.calibration_data(spec, None, None)
    (tmp_path / "imgs").mkdir()
    for i in range(3):
        Image.fromarray(np.full((16, 16), 40 * i, np.uint8)).save(tmp_path / "imgs" / f"{i}.png")
    data = quantize.calibration_data(spec, tmp_path / "imgs", None)
    assert data.shape == (3, 1, 8, 8) and data.dtype == np.float32
    assert data[0].min() == pytest.approx(-1.0)  # black pixel, normalized with mean 0.5 / std 0.5


def test_build_writes_the_int8_variant_with_its_accuracy(digits_build, tmp_path):
    spec, built, _ = digits_build
    repo = tmp_path / "repo"
    build_model(
        BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=tmp_path / "work", precisions=("fp32", "int8")),
        built,
    )
    models = manifest.read_manifest(repo)["models"]
    assert set(models) == {"digits_cnn", "digits_cnn_int8"}
    int8 = models["digits_cnn_int8"]
    assert int8["precision"] == "int8" and models["digits_cnn"]["precision"] == "fp32"
    assert models["digits_cnn"]["accuracy"] - int8["accuracy"] <= 0.01
    assert int8["int8"]["cpu_throughput_batch32"]["int8"] > 0
    assert (repo / "digits_cnn_int8" / "config.pbtxt").read_text().count('name: "digits_cnn_int8"') == 1


def test_fp16_without_tensorrt_is_refused_with_the_way_to_get_it(digits_build, tmp_path):
    spec, _, _ = digits_build
    with pytest.raises(SpecError, match="fp16 needs TensorRT"):
        BuildRequest(spec=spec, target="embedded", repo=tmp_path, work_dir=tmp_path, precisions=("fp32", "fp16"))
