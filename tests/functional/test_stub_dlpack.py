"""The ONNX Runtime model's tensors cross the Python-backend stub through DLPack under numpy 2 (where the stub's own
numpy, built for numpy 1, hands out empty outputs). Held two ways on real tritonservers: the DLPack path taken under
numpy 1 answers exactly as the stub's numpy path; and a server whose stubs run under numpy 2 (a venv over this one
with numpy 2 on top, as a GPU host has) answers as the module, while an older build's model is left out saying why."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as http

from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional

ROOT = Path(__file__).parents[2]
FORCED = "\nimport tpserve.triton_models.python_backend.dlpack_io as _io  # noqa: E402\n\n_io.NUMPY_2 = {}\n"


def _twin(repo: Path, name: str, twin: str, numpy_2: bool) -> None:
    """A copy of repo/name served as twin, its model.py taking the DLPack path (numpy_2) or the stub's numpy."""
    shutil.copytree(repo / name, repo / twin)
    config = (repo / name / "config.pbtxt").read_text()
    (repo / twin / "config.pbtxt").write_text(config.replace(f'name: "{name}"', f'name: "{twin}"', 1))
    model = repo / twin / "1" / "model.py"
    model.write_text(model.read_text() + FORCED.format(numpy_2))


def _built(tmp_path, digits_build) -> tuple:
    spec, built, _ = digits_build
    repo = tmp_path / "repo"
    build_model(BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=tmp_path / "work"), built)
    assert 'key: "dlpack_outputs"' in (repo / spec.name / "config.pbtxt").read_text()  # numbers only
    rows = np.random.default_rng().standard_normal((5, *spec.inputs[0].dims)).astype(np.float32)
    return spec, built, repo, rows


def test_the_dlpack_path_answers_as_the_stubs_numpy_path(tmp_path, digits_build):
    spec, _, repo, rows = _built(tmp_path, digits_build)
    _twin(repo, spec.name, f"{spec.name}_dlpack", numpy_2=True)
    with launcher.running(repo, tmp_path / "state") as state, http.InferenceServerClient(state.http_url) as client:
        answers = {}
        for name in (spec.name, f"{spec.name}_dlpack"):
            tensor = http.InferInput(spec.inputs[0].name, list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            answers[name] = client.infer(name, [tensor]).as_numpy(spec.outputs[0].name)
    assert answers[spec.name].shape == (5, *spec.outputs[0].dims)
    np.testing.assert_array_equal(answers[f"{spec.name}_dlpack"], answers[spec.name])


def _numpy_2_python(folder: Path) -> Path:
    """A venv over this environment with numpy 2 on top (the wheel `make install` fetched): its python."""
    wheel = next(iter(sorted((ROOT / ".tools" / "wheels").glob("numpy-2*.whl"))), None)
    if wheel is None:
        pytest.skip("no numpy 2 wheel in .tools/wheels: `make install` fetches it")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    site = next(folder.glob("lib/python*/site-packages"))
    (site / "zz_this_environment.pth").write_text(next(p for p in sys.path if p.endswith("site-packages")) + "\n")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    subprocess.run(pip, check=True, timeout=300, capture_output=True)
    return folder / "bin" / "python"


def test_under_numpy_2_the_onnx_model_answers_and_an_older_build_is_left_out(tmp_path, digits_build):
    spec, built, repo, rows = _built(tmp_path, digits_build)
    _twin(repo, spec.name, f"{spec.name}_older", numpy_2=False)  # what a build before DLPack wrote, as served
    older = repo / f"{spec.name}_older" / "config.pbtxt"
    older.write_text(older.read_text().replace('key: "dlpack_outputs"', 'key: "was_dlpack_outputs"'))
    python = _numpy_2_python(tmp_path / "numpy2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    version = subprocess.run([python, "-c", "import numpy; print(numpy.__version__)"], env=env, text=True,
                             capture_output=True, check=True).stdout.strip()  # fmt: skip
    assert version.startswith("2."), version
    ports = [str(p) for p in endpoints.free_ports(4)]
    server = [str(python), "-m", "tpserve.server"]
    start = [*server, "start", "--repo", str(repo), "--state-dir", str(tmp_path / "state"), "--http-port", ports[0],
             "--grpc-port", ports[1], "--metrics-port", ports[2], "--health-port", ports[3]]  # fmt: skip
    try:
        started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=300)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        state = endpoints.read_state(tmp_path / "state")
        assert f"numpy {version} is installed" in state.left_out[f"{spec.name}_older"]
        assert spec.name not in state.left_out
        with torch.no_grad():
            want = built.module(torch.from_numpy(rows)).numpy()
        for protocol in ("http", "grpc"):
            got = infer(state.endpoint(protocol), spec.name, {spec.inputs[0].name: rows}).outputs[spec.outputs[0].name]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    finally:
        subprocess.run([*server, "stop", "--state-dir", str(tmp_path / "state")], env=env, timeout=120)
