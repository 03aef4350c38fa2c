"""Rollout parts that need no server: version folders, history, the lock, the gates, the interface check."""

import json
import os
import subprocess
import sys

import pytest

from tpserve.builders.repository.manifest import read_manifest, update_manifest
from tpserve.builders.repository.model_config import parse_pbtxt
from tpserve.clients.checks import CheckFailed, Gate, _output_problem, accuracy_gate
from tpserve.common.errors import ServerError
from tpserve.operations.rollout import RolloutError, _check_compatible
from tpserve.server.supervision.rollout_lock import LOCK, paused_models, rollout_lock
from tpserve.server.triton import model_versions as mv

CONFIG = """
name: "m"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }
"""


def _model_dir(tmp_path, versions):
    folder = tmp_path / "m"
    for v in versions:
        (folder / str(v)).mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    return folder


def test_versions_are_numbered_folders_only(tmp_path):
    folder = _model_dir(tmp_path, [1, 10, 2])
    (folder / ".staging-3-x").mkdir()
    assert mv.disk_versions(folder) == [1, 2, 10]
    assert mv.newest_version(folder).name == "10"
    with pytest.raises(ServerError, match="no numbered version folder"):
        mv.newest_version(tmp_path / "empty")


def test_copy_in_leaves_nothing_half_written(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "model.onnx").write_bytes(b"abc")
    folder = _model_dir(tmp_path, [1])
    mv.copy_in(source, folder / "2")
    assert (folder / "2" / "model.onnx").read_bytes() == b"abc"
    with pytest.raises(OSError):
        mv.copy_in(source, folder / "2")  # the target exists: refused, and the staging copy is gone
    assert sorted(p.name for p in folder.iterdir()) == ["1", "2", "config.pbtxt"]


def test_prune_keeps_the_serving_version_and_the_newest_retired(tmp_path):
    folder = _model_dir(tmp_path, [1, 2, 3, 4])
    assert mv.prune(folder, keep=2, serving=4) == [1, 2]
    assert mv.disk_versions(folder) == [3, 4]
    assert mv.prune(folder, keep=1, serving=3) == [4]  # a rolled-back newer folder is not kept over the serving one


def test_model_files_restore_what_was_there(tmp_path):
    folder = _model_dir(tmp_path, [1])
    (folder / "labels.txt").write_text("a\nb\n")
    (folder / "warmup").mkdir()
    (folder / "warmup" / "random_input_ids").write_bytes(b"\x01" * 8)  # a warmup's data file goes with the config
    before = mv.ModelFiles.read(folder)
    assert set(before.files) == {"config.pbtxt", "labels.txt", "warmup/random_input_ids"}
    mv.ModelFiles({"config.pbtxt": b"changed"}).write(folder)
    assert not (folder / "labels.txt").exists() and (folder / "config.pbtxt").read_bytes() == b"changed"
    assert not (folder / "warmup" / "random_input_ids").exists()
    before.write(folder)
    assert (folder / "labels.txt").read_text() == "a\nb\n" and (folder / "config.pbtxt").read_text() == CONFIG
    assert (folder / "warmup" / "random_input_ids").read_bytes() == b"\x01" * 8


def test_history_starts_with_the_built_version_and_retires_the_serving_one(tmp_path):
    update_manifest(tmp_path, {"name": "m", "sha256": "old", "built_at": "then", "artifact": "m/1/model.onnx"})
    mv.record(tmp_path, "m", {"version": None, "status": "rejected", "reason": "accuracy"})
    entry = mv.versioned_entry({"name": "m", "sha256": "new", "artifact": "m/1/model.onnx"}, "m", 3)
    mv.record(tmp_path, "m", {"version": 3, "status": "serving"}, entry)
    saved = read_manifest(tmp_path)["models"]["m"]
    assert [(h["version"], h["status"]) for h in saved["history"]] == [
        (1, "retired"),
        (None, "rejected"),
        (3, "serving"),
    ]
    assert saved["served_version"] == 3 and saved["artifact"] == "m/3/model.onnx" and saved["sha256"] == "new"


def test_the_lock_is_exclusive_and_pauses_its_models(tmp_path):
    with rollout_lock(tmp_path, ["m", "m__candidate"]):
        assert paused_models(tmp_path) == {"m", "m__candidate"}
        with pytest.raises(ServerError, match="another rollout"):
            with rollout_lock(tmp_path, ["m"]):
                pass
    assert paused_models(tmp_path) == set() and not (tmp_path / LOCK).exists()


def test_a_lock_left_by_a_dead_process_is_stale(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / LOCK).write_text(json.dumps({"pid": int(dead.stdout), "models": ["m"]}))
    assert paused_models(tmp_path) == set()
    with rollout_lock(tmp_path, ["m"]):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()


def test_accuracy_gate():
    gate = Gate(tolerance=0.01, budget=0.02)
    assert accuracy_gate(0.975, 0.98, 0.99, gate)["accuracy"] == 0.975
    with pytest.raises(CheckFailed, match="below the 0.9800 its build recorded"):
        accuracy_gate(0.95, 0.98, None, gate)
    with pytest.raises(CheckFailed, match="below the serving version's 0.9900"):
        accuracy_gate(0.96, 0.96, 0.99, gate)
    assert accuracy_gate(0.5, None, None, gate)["accuracy"] == 0.5


def test_smoke_output_problems():
    import numpy as np

    assert _output_problem(np.zeros((2, 3), np.float32), 2) is None
    assert _output_problem(np.zeros((0, 3), np.float32), 2) == "is empty"
    assert _output_problem(np.zeros((1, 3), np.float32), 2) == "has batch 1, expected 2"
    assert _output_problem(np.array([[np.nan]], np.float32), 1) == "holds NaN or infinity"


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c: c.replace("dims: [ 2 ]", "dims: [ 3 ]"), "changes the model's interface"),
        (lambda c: c.replace("TYPE_FP32 dims: [ 4 ]", "TYPE_FP16 dims: [ 4 ]"), "changes the model's interface"),
        (lambda c: c.replace("max_batch_size: 8", "max_batch_size: 4"), "max_batch_size 4 is below the served 8"),
        (lambda c: c.replace('name: "m"', 'name: "n"'), "names the model 'n'"),
        (lambda c: c + "version_policy { all {} }", "serves several versions"),
    ],
)
def test_interface_changes_are_refused(edit, match):
    with pytest.raises(RolloutError, match=match):
        _check_compatible("m", parse_pbtxt(edit(CONFIG)), parse_pbtxt(CONFIG))


def test_compatible_changes_pass():
    bigger = CONFIG.replace("max_batch_size: 8", "max_batch_size: 16") + "instance_group { count: 3 }"
    _check_compatible("m", parse_pbtxt(bigger), parse_pbtxt(CONFIG))
