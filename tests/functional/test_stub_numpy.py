"""The Python-backend stub was built for numpy 1, and a GPU host has numpy 2 (where the stub's own numpy hands out
empty outputs). On real tritonservers: the ONNX Runtime model's tensors cross the stub through DLPack, and that path
taken under numpy 1 answers exactly as the stub's numpy path; a server whose stubs run under numpy 2 (a venv over this
one with numpy 2 on top, as a GPU host has) answers as the module there, while an older build's model is left out
saying why; and with the stubs' own environment (TPSERVE_STUB_PYTHON: numpy 1, as the bundle's install.sh makes on
such a host) every model is served, the image pipelines' BYTES steps included."""

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


def _start(python: Path, repo: Path, state_dir: Path, env: dict) -> endpoints.ServerState:
    ports = [str(p) for p in endpoints.free_ports(4)]
    start = [str(python), "-m", "tpserve.server", "start", "--repo", str(repo), "--state-dir", str(state_dir)]
    start += ["--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2], "--health-port", ports[3]]
    started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    return endpoints.read_state(state_dir)


def _stop(python: Path, state_dir: Path, env: dict) -> None:
    subprocess.run([str(python), "-m", "tpserve.server", "stop", "--state-dir", str(state_dir)], env=env, timeout=120)


def test_with_the_stubs_own_numpy_1_every_model_is_served_under_numpy_2(tmp_path, digits_build):
    from tpserve.builders.repository.pipelines import write_image_pipelines

    spec, built, repo, _ = _built(tmp_path, digits_build)
    write_image_pipelines(repo, spec, top_k=3)
    python = _numpy_2_python(tmp_path / "numpy2")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TPSERVE_STUB_PYTHON": sys.executable}  # this one: numpy 1
    try:
        state = _start(python, repo, tmp_path / "state", env)
        assert state.left_out == {}
        pixels = np.random.default_rng().integers(0, 256, (4, 8, 8, 1)).astype(np.uint8)
        for protocol in ("http", "grpc"):
            out = infer(state.endpoint(protocol), f"{spec.name}_pipeline_u8", {"IMAGE": pixels}).outputs
            assert out["CLASS_IDS"].shape == (4, 3)
            assert [label.decode() for label in out["LABELS"][:, 0]] == [str(i) for i in out["CLASS_IDS"][:, 0]]
    finally:
        _stop(python, tmp_path / "state", env)
    env["TPSERVE_STUB_PYTHON"] = str(tmp_path / "nowhere" / "python3")
    start = [str(python), "-m", "tpserve.server", "start", "--repo", str(repo), "--state-dir", str(tmp_path / "s2")]
    refused = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "TPSERVE_STUB_PYTHON=" in refused.stderr + refused.stdout


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
    env.pop("TPSERVE_STUB_PYTHON", None)  # the stubs run in the server's environment: numpy 2
    try:
        state = _start(python, repo, tmp_path / "state", env)
        assert f"numpy {version} is installed" in state.left_out[f"{spec.name}_older"]
        assert spec.name not in state.left_out
        with torch.no_grad():
            want = built.module(torch.from_numpy(rows)).numpy()
        for protocol in ("http", "grpc"):
            got = infer(state.endpoint(protocol), spec.name, {spec.inputs[0].name: rows}).outputs[spec.outputs[0].name]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    finally:
        _stop(python, tmp_path / "state", env)


def test_the_bundles_install_gives_a_numpy_2_host_the_stubs_own_numpy_1(tmp_path):
    """install.sh on a host whose python3 has numpy 2: stub-env/ (numpy 1 over the host's packages, torch included),
    named by the TPSERVE_STUB_PYTHON it prints; on a host with numpy 1, nothing of the kind."""
    from tpserve.loadtest.bundle import INSTALL_SH

    numpy_1 = next(iter(sorted((ROOT / ".tools" / "wheels").glob("numpy-1*.whl"))), None)
    if numpy_1 is None:
        pytest.skip("no numpy 1 wheel in .tools/wheels: `make install` fetches it")
    host = _numpy_2_python(tmp_path / "host")
    bundle = tmp_path / "triton-bundle"
    for folder in ("wheels", "stub"):
        (bundle / folder).mkdir(parents=True)
    shutil.copy2(numpy_1, bundle / "stub")
    shutil.copy2(numpy_1, bundle / "wheels")  # any wheel: what site/ gets is not this test's
    (bundle / "install.sh").write_text(INSTALL_SH)
    on_path = {**os.environ, "PATH": f"{host.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["sh", str(bundle / "install.sh")], env=on_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (stub,) = [line.split("=", 1)[1] for line in done.stdout.splitlines() if "TPSERVE_STUB_PYTHON=" in line]
    assert stub == str(bundle / "stub-env" / "bin" / "python3")
    check = "import numpy, torch; print(numpy.__version__)"
    assert subprocess.run([stub, "-c", check], capture_output=True, text=True, timeout=300).stdout.strip() == "1.26.4"
    on_numpy_1 = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    again = subprocess.run(["sh", str(bundle / "install.sh")], env=on_numpy_1, capture_output=True, text=True)
    assert again.returncode == 0 and "TPSERVE_STUB_PYTHON" not in again.stdout
