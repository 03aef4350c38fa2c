"""Compiled engines (torch.compile/inductor) on the CPU: built ahead of time, gated, cached, served, guarded.

The GPU side (fp16/bf16, CUDA graphs, uint8 input) is in tests/gpu; this is the same path for
KIND_CPU instances, where inductor compiles C++ kernels, so CI exercises all of it for real.
"""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import torch

from tpserve.builders.build import build_model, build_torch_variant
from tpserve.builders.checks.guard import GuardError
from tpserve.builders.repository.manifest import read_manifest
from tpserve.builders.repository.writer import TorchRuntime
from tpserve.builders.request import BuildRequest
from tpserve.clients.infer import infer
from tpserve.common.errors import ValidationError
from tpserve.server.triton import launcher

ENGINE = "digits_cnn_inductor_fp32_nographs"


@pytest.fixture(scope="module")
def compiled_repo(digits_build, tmp_path_factory):
    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("compiled")
    request = BuildRequest(spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work")
    build_model(request, built)
    entry = build_torch_variant(request, TorchRuntime(precision="fp32", compiler="inductor"))
    return spec, built, root, entry


def test_the_engine_is_an_artifact_with_its_cache_versions_and_gate(compiled_repo):
    spec, _, root, entry = compiled_repo
    version = root / "repo" / ENGINE / "1"
    assert sorted(p.name for p in version.iterdir()) == ["compile_cache.bin", "model.pt2", "model.py", "spec.json"]
    assert 'key: "compiler"' in (root / "repo" / ENGINE / "config.pbtxt").read_text()
    compiled = read_manifest(root / "repo")["models"][ENGINE]["compiled"]
    from importlib import metadata

    assert compiled["torch"] == metadata.version("torch") and compiled["device"] == "cpu"
    assert compiled["cache_bytes"] == (version / "compile_cache.bin").stat().st_size > 0
    assert compiled["compile_seconds"] > 0 and entry["validation"]["passed"]
    report = json.loads((root / "work" / spec.name / f"{ENGINE}.validation.compiled.json").read_text())
    assert report["passed"] and [b["batch"] for b in report["batches"]] == list(spec.validation_batch_sizes)
    (logits,) = entry["validation"]["outputs"]  # every output's figures against fp32, the worst case of the batches
    assert logits["output"] == "logits" and logits["kind"] == "class scores" and logits["top1"] == 1.0
    assert logits["cosine"] > 0.9999 and logits["relative_error"] < 1e-3 and logits == report["outputs"][0]


def test_the_served_engine_matches_the_module_over_http_and_grpc(compiled_repo):
    spec, built, root, _ = compiled_repo
    with launcher.running(root / "repo", root / "state") as state:
        for protocol in ("http", "grpc"):
            ep = state.endpoint(protocol, root / "repo")
            for batch in (1, 3, spec.max_batch_size):
                x = np.random.default_rng(batch).standard_normal((batch, 1, 8, 8)).astype(np.float32)
                got = infer(ep, ENGINE, {"input": x}).outputs["logits"]
                with torch.no_grad():
                    want = built.module(torch.from_numpy(x)).numpy()
                np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)
    log = (root / "state" / "tritonserver.log").read_text()
    assert f"successfully loaded '{ENGINE}'" in log


def test_an_engine_compiled_by_another_torch_is_refused_before_the_server_starts(compiled_repo, tmp_path):
    _, _, root, _ = compiled_repo
    repo = tmp_path / "repo"
    shutil.copytree(root / "repo", repo)
    manifest = json.loads((repo / "manifest.json").read_text())
    manifest["models"][ENGINE]["compiled"]["torch"] = "2.0.0"
    (repo / "manifest.json").write_text(json.dumps(manifest))
    settings = launcher.ServerSettings(repo, state_dir=tmp_path / "state")
    with pytest.raises(GuardError, match=f"{ENGINE}: compiled with torch 2.0.0, .* rebuild {ENGINE} on the server"):
        launcher.start(settings)
    assert not (tmp_path / "state" / "tritonserver.log").exists()


def test_an_engine_that_fails_the_gate_is_not_written(compiled_repo):
    spec, _, root, _ = compiled_repo
    strict = dataclasses.replace(spec, tolerances={**spec.tolerances, "bf16": (1e-7, 0.0)})
    request = BuildRequest(spec=strict, target="embedded", repo=root / "repo", work_dir=root / "work")
    with pytest.raises(ValidationError, match=r"inductor bf16 engine of 'digits_cnn' failed validation .* max abs"):
        build_torch_variant(request, TorchRuntime(precision="bf16", compiler="inductor"))
    assert not (root / "repo" / "digits_cnn_inductor_bf16_nographs").exists()
    assert "digits_cnn_inductor_bf16_nographs" not in read_manifest(root / "repo")["models"]
    assert (root / "work" / spec.name / "digits_cnn_inductor_bf16_nographs.validation.compiled.json").exists()


def test_an_engine_past_the_agreement_its_spec_declares_is_not_written_and_the_build_says_which_output(compiled_repo):
    """Within the element-wise tolerances (loosened), but past the spec's own agreement for bf16 (a relative error of
    at most 1e-9, which bfloat16 cannot hold): not written, and the build names the output, the figure and the
    limit."""
    spec, _, root, _ = compiled_repo
    loose = {**spec.tolerances, "bf16": (1.0, 1.0)}  # the element-wise gate passes it
    strict = dataclasses.replace(spec, tolerances=loose, agreement={**spec.agreement, "bf16": {"relative_error": 1e-9}})
    request = BuildRequest(spec=strict, target="embedded", repo=root / "repo", work_dir=root / "work")
    with pytest.raises(ValidationError, match=r"output 'logits' \(class scores\): relative error .* vs at most 1e-09"):
        build_torch_variant(request, TorchRuntime(precision="bf16", compiler="inductor"))
    assert not (root / "repo" / "digits_cnn_inductor_bf16_nographs").exists()


def test_the_builder_cli_builds_compiled_engines_and_refuses_unknown_precisions_up_front(tmp_path):
    import subprocess
    import sys

    common = [
        sys.executable,
        "-m",
        "tpserve.builders",
        "build",
        "--models",
        "digits_cnn",
        "--repo",
        str(tmp_path / "repo"),
        "--work-dir",
        str(tmp_path / "work"),
        "--no-pipelines",
        "--target",
        "embedded",
    ]
    refused = subprocess.run([*common, "--compiled", "fp8"], capture_output=True, text=True)
    assert refused.returncode != 0 and "--compiled ['fp8']: unknown precision" in refused.stderr
    assert not (tmp_path / "repo").exists()  # refused before anything was built
    done = subprocess.run([*common, "--compiled", "fp32"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"built {ENGINE}" in done.stdout
    assert (tmp_path / "repo" / ENGINE / "1" / "compile_cache.bin").stat().st_size > 0
    assert read_manifest(tmp_path / "repo")["models"][ENGINE]["compiled"]["device"] == "cpu"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a folder as another local user (nobody)")
def test_the_server_loads_kernels_from_its_own_folder_not_a_planted_tmp_one(compiled_repo, tmp_path):
    """A local user who creates /tmp/torchinductor_<user> first (open to all) gets nothing written there."""
    import getpass
    import pwd
    import tempfile
    from pathlib import Path

    spec, _, root, _ = compiled_repo
    planted = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    made = not planted.exists()
    if made:
        planted.mkdir()
        nobody = pwd.getpwnam("nobody")
        os.chown(planted, nobody.pw_uid, nobody.pw_gid)
        os.chmod(planted, 0o777)
    before = sorted(planted.rglob("*"))
    try:
        with launcher.running(root / "repo", tmp_path / "state") as state:
            x = np.zeros((2, 1, 8, 8), np.float32)
            assert infer(state.endpoint("grpc", root / "repo"), ENGINE, {"input": x}).outputs["logits"].shape == (2, 10)
        cache = tmp_path / "state" / "kernel-cache"
        assert (cache.stat().st_mode & 0o777) == 0o700 and any(cache.rglob("*.so")), "kernels not in the state folder"
        assert sorted(planted.rglob("*")) == before, "the server wrote into the shared /tmp folder"
    finally:
        if made:
            shutil.rmtree(planted, ignore_errors=True)
