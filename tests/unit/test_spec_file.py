"""Spec files: every invalid field refused with the file, the model and the field named, and no model
folder left behind; valid files give the specs and serving options they declare."""

import dataclasses
import shutil
from pathlib import Path

import pytest

from tests.user_models import ACME, write_package
from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import spec_file
from tpserve.common.errors import ToolError

CASES = sorted(p for p in (Path(__file__).parents[1] / "fixtures" / "invalid_specs").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return write_package(tmp_path_factory.mktemp("acme"))


def _build_all(path: Path, repo: Path, work: Path) -> None:
    for user in spec_file.load(path):
        build_model(
            BuildRequest(
                spec=user.spec,
                target="embedded",
                repo=repo,
                work_dir=work,
                options=user.serving,
                precisions=user.precisions,
                calibration=user.calibration,
            )
        )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_invalid_spec_is_refused_naming_file_model_and_field(case, package, tmp_path):
    folder = tmp_path / "project"
    shutil.copytree(package, folder)
    shutil.copy(case / "models.toml", folder / "models.toml")
    expected = (case / "expected_error.txt").read_text().strip()
    with pytest.raises(ToolError) as info:
        _build_all(folder / "models.toml", tmp_path / "repo", tmp_path / "work")
    message = str(info.value)
    assert expected in message
    assert str(folder / "models.toml") in message  # the file is named
    repo = tmp_path / "repo"
    assert not repo.exists() or [p.name for p in repo.iterdir()] == []  # no model folder, no staging left


def test_a_valid_spec_gives_what_it_declares(package, tmp_path):
    folder = tmp_path / "project"
    shutil.copytree(package, folder)
    text = ACME + '\nprecisions = ["fp32", "int8"]\ncalibration = "calib.npz"\n'
    text += (
        "serving = { instances = 2, max_queue_delay_us = 500, preferred_batch_sizes = [4], ragged_batching = false }\n"
    )
    (folder / "models.toml").write_text(text)
    (folder / "calib.npz").write_bytes(b"")  # must exist; its content is read by the INT8 build only
    (user,) = spec_file.load(folder / "models.toml")
    spec = user.spec
    assert spec.name == "acme_classifier" and spec.max_batch_size == 8
    assert [t.name for t in spec.inputs] == ["image", "ids"] and [t.name for t in spec.outputs] == [
        "logits",
        "embedding",
    ]
    assert spec.inputs[1].dims == (-1,) and spec.inputs[1].axes == ("seq",) and spec.axis_range("seq") == (1, 24)
    assert spec.inputs[1].value_range == (0, 50)
    assert spec.builder_args["checkpoint"] == str(folder / "weights" / "acme.pt")
    assert spec.builder_args["python_path"] == [str(folder / "src")]
    assert user.precisions == ("fp32", "int8") and user.calibration == folder / "calib.npz"
    assert user.serving.instances == 2 and user.serving.preferred_batch_sizes == (4,)
    assert user.serving.ragged_batching is False
    assert spec.validation_batch_sizes == (1, 3, 8)


def test_unnamed_dynamic_dims_are_independent_axes(package, tmp_path):
    text = ACME.replace('dims = ["seq"]', "dims = [-1]").replace("dynamic_axes = { seq = [1, 24] }", "")
    (package / "independent.toml").write_text(text)
    (user,) = spec_file.load(package / "independent.toml")
    assert user.spec.inputs[1].axes == ("inputs_1_d1",)


def test_not_toml_and_no_models_are_refused(tmp_path):
    (tmp_path / "a.toml").write_text("[[model]\nname =")
    with pytest.raises(ToolError, match="is not valid TOML"):
        spec_file.load(tmp_path / "a.toml")
    (tmp_path / "b.toml").write_text('title = "x"\n')
    with pytest.raises(ToolError, match=r"expected one or more \[\[model\]\] tables, found other top-level keys"):
        spec_file.load(tmp_path / "b.toml")
    with pytest.raises(ToolError, match="cannot be read"):
        spec_file.load(tmp_path / "missing.toml")


def test_the_example_spec_file_of_the_readme_loads():
    (user,) = spec_file.load(Path(__file__).parents[2] / "examples" / "models.toml")
    assert user.spec.name == "mobilenet_v3_small" and user.spec.builder_args["factory"].startswith("torchvision")


def test_a_spec_given_through_a_parent_folder_keeps_its_path_fields(package, tmp_path, monkeypatch):
    """`make build-engines SPEC=../models/models.toml`: path fields resolve in the spec's folder."""
    shutil.copytree(package, tmp_path / "models")
    (tmp_path / "models" / "models.toml").write_text(ACME)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    (user,) = spec_file.load(Path("../models/models.toml"))
    assert user.spec.name


def test_a_tokenizer_makes_a_text_pipeline_only_for_ids_and_a_mask(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    encoder = """
[[model]]
name = "encoder"
exported = "model.pt2"
max_batch_size = 8
inputs = [ { name = "input_ids", dtype = "INT64", dims = ["seq"] }, { name = "%s", dtype = "INT64", dims = ["seq"] } ]
outputs = [ { name = "embedding", dtype = "FP32", dims = [8] } ]
dynamic_axes = { seq = [1, 24] }
pooling = "mean"
tokenizer = "tokenizer.json"
"""
    (tmp_path / "model.pt2").write_bytes(b"x")
    (tmp_path / "models.toml").write_text(encoder % "attention_mask")
    (user,) = spec_file.load(tmp_path / "models.toml")
    assert user.spec.builder_args["tokenizer"] == str(tmp_path / "tokenizer.json")
    (tmp_path / "models.toml").write_text(
        (encoder % "attention_mask").replace('dims = ["seq"] }, {', "dims = [4] }, {")
    )
    with pytest.raises(ToolError, match="field 'tokenizer': a text pipeline feeds token ids and an attention mask"):
        spec_file.load(tmp_path / "models.toml")


def test_a_serving_switch_must_be_true_or_false(package):
    text = ACME + 'serving = { ragged_batching = "no" }\n'
    (package / "switch.toml").write_text(text)
    with pytest.raises(ToolError, match="serving.ragged_batching.*'no' is not true or false"):
        spec_file.load(package / "switch.toml")


def test_serving_options_typed_on_the_command_line_override_a_specs_serving_table():
    from click.core import ParameterSource

    from tpserve.builders.__main__ import _given_serving
    from tpserve.builders.repository.writer import ServingOptions

    class Typed:
        def __init__(self, names):
            self.names = names

        def get_parameter_source(self, name):
            return ParameterSource.COMMANDLINE if name in self.names else ParameterSource.DEFAULT

    options = ServingOptions(instances=3, max_queue_delay_us=700, ragged_batching=False, intra_op_threads=2)
    assert _given_serving(Typed(set()), options) == {}  # defaults leave the spec's table as it is
    given = _given_serving(Typed({"no_ragged_batching", "max_queue_delay_us"}), options)
    assert given == {"ragged_batching": False, "max_queue_delay_us": 700}
    spec_table = ServingOptions(instances=2, max_queue_delay_us=100)
    merged = dataclasses.replace(spec_table, **given)
    assert (merged.instances, merged.max_queue_delay_us, merged.ragged_batching) == (2, 700, False)


def test_max_batch_on_the_command_line_overrides_a_spec_files_model(package):
    from tpserve.builders.__main__ import _with_max_batch

    (package / "max_batch.toml").write_text(ACME)
    (user,) = spec_file.load(package / "max_batch.toml")
    assert user.spec.max_batch_size == 8 and user.spec.validation_batch_sizes == (1, 3, 8)
    assert _with_max_batch(user.spec, None) is user.spec
    smaller = _with_max_batch(user.spec, 2)
    assert smaller.max_batch_size == 2 and smaller.validation_batch_sizes == (1, 2)
    assert _with_max_batch(user.spec, 64).validation_batch_sizes == (1, 3, 8)
