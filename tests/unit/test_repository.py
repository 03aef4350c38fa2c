"""The repository writer: complete model folders or none, and the manifest."""

import dataclasses
import json
import subprocess
import sys

import pytest

from tpserve.builders.build import build_model
from tpserve.builders.repository import manifest
from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.model_config import parse_pbtxt
from tpserve.builders.request import BuildRequest
from tpserve.common.errors import ConfigError


def test_build_writes_a_complete_model_and_manifest(digits_build, tmp_path):
    spec, built, _ = digits_build
    repo = tmp_path / "repo"
    entry = build_model(BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=tmp_path / "work"), built)
    folder = repo / spec.name
    assert sorted(p.name for p in folder.iterdir()) == ["1", "config.pbtxt", "labels.txt"]
    assert sorted(p.name for p in (folder / "1").iterdir()) == ["model.onnx", "model.py"]
    assert parse_pbtxt((folder / "config.pbtxt").read_text()).backend == "python"
    written = manifest.read_manifest(repo)["models"][spec.name]
    assert written == entry
    assert written["accuracy"] == built.metrics["accuracy"] and written["validation"]["passed"]
    assert len(written["sha256"]) == 64 and written["versions"]["torch"].startswith("2.")
    assert written["host"]["cores"] >= 1


def test_ngc_target_has_no_python_model(digits_build, tmp_path):
    spec, built, _ = digits_build
    build_model(BuildRequest(spec=spec, target="ngc", repo=tmp_path / "repo", work_dir=tmp_path / "work"), built)
    assert sorted(p.name for p in (tmp_path / "repo" / spec.name / "1").iterdir()) == ["model.onnx"]


def test_a_failed_write_leaves_the_previous_model_and_no_staging(digits_build, tmp_path):
    spec, built, result = digits_build
    repo = tmp_path / "repo"
    config = repository.model_config(spec, "embedded")
    repository.write_model(repo, spec, config, {"model.onnx": result.path}, "embedded")
    before = (repo / spec.name / "config.pbtxt").read_text()
    with pytest.raises(FileNotFoundError):
        repository.write_model(repo, spec, config, {"model.onnx": tmp_path / "missing.onnx"}, "embedded")
    assert [p.name for p in repo.iterdir()] == [spec.name]
    assert (repo / spec.name / "config.pbtxt").read_text() == before


def test_cli_reports_user_errors_without_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "tpserve.builders", "build", "--models", "nosuchmodel", "--repo", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "error: model 'nosuchmodel' is not in the zoo" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()


def test_compiled_variants_are_named_and_configured_for_the_torch_runtime():
    from tpserve.builders.spec import zoo
    from tpserve.common.errors import ConfigError

    spec = zoo.get_spec("resnet18", image_size=64, max_batch_size=8)
    gpu = repository.ServingOptions(kind="KIND_GPU")
    runtime = repository.TorchRuntime(
        precision="bf16", channels_last=True, cuda_graphs=True, uint8_input=True, compiler="inductor", host_outputs=True
    )
    config = repository.torch_config(spec, runtime, gpu)
    assert config.name == "resnet18_64_inductor_bf16_u8"
    params = parse_pbtxt(config.to_pbtxt()).parameters
    values = {k: params[k].string_value for k in ("compiler", "precision", "host_outputs", "cuda_graphs")}
    assert values == {"compiler": "inductor", "precision": "bf16", "host_outputs": "1", "cuda_graphs": "1"}
    assert repository.TorchRuntime(precision="fp16", compiler="inductor").variant("m") == "m_inductor_fp16_nographs"
    assert repository.TorchRuntime(precision="fp16", cuda_graphs=True).variant("m") == "m_torch_fp16_graphs"
    with pytest.raises(ConfigError, match="compiler 'xla': expected 'inductor'"):
        repository.TorchRuntime(precision="fp16", compiler="xla")
    with pytest.raises(ConfigError, match="precision 'int8'"):
        repository.TorchRuntime(precision="int8")


def test_gpu_torch_runtime_refuses_several_instances_with_dynamic_batching():
    from tpserve.builders.spec import zoo
    from tpserve.common.errors import ConfigError

    spec = zoo.get_spec("digits_cnn")
    runtime = repository.TorchRuntime(precision="fp16")
    with pytest.raises(ConfigError, match="Use 1 instance with dynamic batching"):
        repository.torch_config(spec, runtime, repository.ServingOptions(instances=2, kind="KIND_GPU"))
    unbatched = repository.ServingOptions(instances=2, kind="KIND_GPU", dynamic_batching=False)
    assert repository.torch_config(spec, runtime, unbatched).dynamic_batching is None
    assert repository.torch_config(spec, runtime, repository.ServingOptions(instances=2)).dynamic_batching  # CPU


def test_manifest_entries_are_typed_records_and_old_manifests_still_read(tmp_path):
    old = {"name": "m", "target": "embedded", "backend": "python", "precision": "fp32", "spec": {}, "versions": {}}
    old |= {"host": {}, "built_at": "2026-01-01T00:00:00Z", "accuracy": None, "future_key": [1]}
    (tmp_path / manifest.MANIFEST).write_text(json.dumps({"models": {"m": old}}))  # before format_version
    read = manifest.read_manifest(tmp_path)
    assert read["format_version"] == manifest.FORMAT_VERSION and read["models"]["m"] == old
    entry = manifest.entries(tmp_path)["m"]
    assert entry.precision == "fp32" and entry.extra == {"future_key": [1]} and entry.to_dict() == old
    manifest.update_manifest(tmp_path, dataclasses.replace(entry, name="n", accuracy=0.9))
    written = json.loads((tmp_path / manifest.MANIFEST).read_text())
    assert written["format_version"] == manifest.FORMAT_VERSION and written["models"]["n"]["accuracy"] == 0.9
    with pytest.raises(TypeError):
        manifest.ManifestEntry("m", "embedded")  # keyword-only
    (tmp_path / manifest.MANIFEST).write_text(json.dumps({"format_version": 99, "models": {}}))
    with pytest.raises(ConfigError, match="format_version 99; .* update this project"):
        manifest.read_manifest(tmp_path)
