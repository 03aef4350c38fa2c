"""The ONNX Runtime model's tensors through DLPack (its path under numpy 2, where the stub's own numpy hands out
empty outputs) answer exactly as the stub's numpy path: the same build served both ways by one real tritonserver.
Under numpy 1 here, the DLPack path is taken by a copy of the model that sets it; a GPU host with numpy 2 serves
it by default (tests/gpu)."""

import shutil

import numpy as np
import tritonclient.http as http

from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.server.triton import launcher

FORCED = "\nimport tpserve.triton_models.python_backend.dlpack_io as _io  # noqa: E402\n\n_io.NUMPY_2 = True\n"


def test_the_dlpack_path_answers_as_the_stubs_numpy_path(tmp_path, digits_build):
    spec, built, _ = digits_build
    repo = tmp_path / "repo"
    build_model(BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=tmp_path / "work"), built)
    config = (repo / spec.name / "config.pbtxt").read_text()
    assert 'key: "dlpack_outputs"' in config  # numbers only: served under numpy 2 too
    twin = repo / f"{spec.name}_dlpack"
    shutil.copytree(repo / spec.name, twin)
    (twin / "config.pbtxt").write_text(config.replace(f'name: "{spec.name}"', f'name: "{twin.name}"', 1))
    model = twin / "1" / "model.py"
    model.write_text(model.read_text() + FORCED)
    rows = np.random.default_rng().standard_normal((5, *spec.inputs[0].dims)).astype(np.float32)
    with launcher.running(repo, tmp_path / "state") as state, http.InferenceServerClient(state.http_url) as client:
        answers = {}
        for name in (spec.name, twin.name):
            tensor = http.InferInput(spec.inputs[0].name, list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            answers[name] = client.infer(name, [tensor]).as_numpy(spec.outputs[0].name)
    assert answers[spec.name].shape == (5, *spec.outputs[0].dims)
    np.testing.assert_array_equal(answers[twin.name], answers[spec.name])
