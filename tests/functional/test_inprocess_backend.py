"""The in-process torch backend on a real tritonserver (CPU instances here; the GPU paths: tests/gpu).

Three variants of one ResNet-18 (64 px, max batch 4) against the Python backend's answers: the staged path
(uint8 input, what CUDA graphs take on a GPU; eager here) answered inline and through the completion thread,
and the general path (float input, no graphs)."""

import dataclasses
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tpserve.builders.build import build_model, build_torch_variant
from tpserve.builders.repository.writer import ServingOptions, TorchRuntime
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import zoo
from tpserve.clients.infer import infer
from tpserve.common.errors import ClientError, ServerError
from tpserve.server.triton import launcher

SPEC = dict(image_size=64, max_batch_size=4)
REFERENCE = "resnet18_64_torch_fp32_u8"
STAGED = "resnet18_64_torch_fp32_graphs_u8_inproc"
GENERAL = "resnet18_64_torch_fp32_inproc"
THREADED = "resnet18_64_threaded_inproc"  # STAGED with inline_rows 0: every batch through the completion thread


def _toolchain_missing() -> str:
    import sysconfig
    from pathlib import Path

    from tpserve.common.native_build import c_compiler

    if c_compiler() is None:
        return "no C compiler ($CC, cc or gcc): the in-process backend is built on the serving host"
    if not (Path(sysconfig.get_config_var("INCLUDEPY") or "") / "Python.h").exists():
        return "no Python headers: the in-process backend is built on the serving host"
    return ""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if _toolchain_missing():
        pytest.skip(_toolchain_missing())
    root = tmp_path_factory.mktemp("inprocess")
    spec = zoo.get_spec("resnet18", **SPEC)
    repo, work = root / "repo", root / "work"
    build_model(
        BuildRequest(spec=spec, target="embedded", repo=root / "scratch", work_dir=work), zoo.build_module(spec)
    )
    # a float range on the image: held on the general path; on the uint8 wire (bytes, not the range) it is not
    bounded = dataclasses.replace(spec, inputs=(dataclasses.replace(spec.inputs[0], value_range=(-10.0, 10.0)),))
    finite = dataclasses.replace(bounded, inputs=(dataclasses.replace(bounded.inputs[0], finite=True),))
    for runtime, declared in (
        (TorchRuntime(precision="fp32", uint8_input=True), spec),
        (TorchRuntime(precision="fp32", uint8_input=True, cuda_graphs=True, inprocess=True), bounded),
        (TorchRuntime(precision="fp32", inprocess=True), finite),
    ):
        build_torch_variant(
            BuildRequest(
                spec=declared,
                target="embedded",
                repo=repo,
                work_dir=work,
                options=ServingOptions(max_queue_delay_us=5000),
            ),
            runtime,
        )
    _copy_with_inline_rows_0(repo / STAGED, repo / THREADED)
    with launcher.running(repo, root / "state") as state:
        yield spec, state


def _copy_with_inline_rows_0(source, target):
    import shutil

    shutil.copytree(source, target)
    config = (target / "config.pbtxt").read_text().replace(f'name: "{source.name}"', f'name: "{target.name}"')
    extra = 'parameters {\n  key: "inline_rows"\n  value {\n    string_value: "0"\n  }\n}\n'
    (target / "config.pbtxt").write_text(config + extra)


def _pixels(batch, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (batch, 64, 64, 3), dtype=np.uint8)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_in_process_backend_answers_like_the_python_backend(served, protocol):
    spec, state = served
    ep = state.endpoint(protocol)
    for batch in (1, 3, 4):
        pixels = _pixels(batch, batch)
        want = infer(ep, REFERENCE, {"input": pixels}).outputs["logits"]
        for model in (STAGED, THREADED):
            got = infer(ep, model, {"input": pixels}).outputs["logits"]
            assert got.shape == (batch, 1000)
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_the_general_path_serves_float_input(served):
    from PIL import Image

    from tpserve.clients.inputs import preprocess_image

    spec, state = served
    ep = state.endpoint("grpc")
    pixels = _pixels(2, 7)
    floats = np.stack([preprocess_image(Image.fromarray(p), spec) for p in pixels])
    want = infer(ep, REFERENCE, {"input": pixels}).outputs["logits"]
    got = infer(ep, GENERAL, {"input": floats}).outputs["logits"]
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-3)


def test_the_general_path_holds_a_float_input_declared_finite(served):
    """The spec declares the general variant's input finite (its warmup sample then zeros: Triton's random data holds
    NaN): NaN in one row refuses that request, naming the row, before the model runs, as the Python-backend models
    do; the next request is served."""
    spec, state = served
    ep = state.endpoint("http")
    floats = np.zeros((2, 3, 64, 64), np.float32)
    floats[1, 0, 5, 5] = np.nan
    with pytest.raises(ClientError, match=r"input input: values must be finite .*: row 1"):
        infer(ep, GENERAL, {"input": floats})
    assert infer(ep, GENERAL, {"input": np.zeros((2, 3, 64, 64), np.float32)}).outputs["logits"].shape == (2, 1000)


def test_the_general_path_holds_a_float_input_s_declared_range_bounds_included(served):
    """value_range [-10, 10] on the float input: 10.5 in row 1 refuses that request with the range and the row;
    the bounds themselves are inside (a float range is closed)."""
    spec, state = served
    ep = state.endpoint("grpc")
    floats = np.zeros((2, 3, 64, 64), np.float32)
    floats[1, 2, 0, 0] = 10.5
    with pytest.raises(ClientError, match=re.escape("input input: values must lie in [-10, 10]") + ".*: row 1"):
        infer(ep, GENERAL, {"input": floats})
    floats[1, 2, 0, 0], floats[0, 0, 0, 0] = 10.0, -10.0
    assert infer(ep, GENERAL, {"input": floats}).outputs["logits"].shape == (2, 1000)


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(served):
    spec, state = served
    ep = state.endpoint("grpc")
    pixels = _pixels(16, 11)
    want = infer(ep, REFERENCE, {"input": pixels[:4]}).outputs["logits"]
    want = np.concatenate(
        [want] + [infer(ep, REFERENCE, {"input": pixels[i : i + 4]}).outputs["logits"] for i in (4, 8, 12)]
    )
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: infer(ep, THREADED, {"input": pixels[i : i + 1]}), range(16)))
    for i, answer in enumerate(answers):
        np.testing.assert_allclose(answer.outputs["logits"], want[i : i + 1], atol=1e-4, rtol=1e-4)


def test_a_request_that_cannot_be_valid_is_refused_and_the_server_stays_up(served):
    spec, state = served
    ep = state.endpoint("http")
    pid = state.pid
    with pytest.raises(ClientError, match=re.compile("UINT8|data-type|datatype", re.I)):
        infer(ep, STAGED, {"input": np.zeros((1, 64, 64, 3), dtype=np.float32)})
    with pytest.raises(ClientError):
        infer(ep, STAGED, {"input": np.zeros((1, 32, 64, 3), dtype=np.uint8)})
    os.kill(pid, 0)  # still there
    assert infer(ep, STAGED, {"input": _pixels(1)}).outputs["logits"].shape == (1, 1000)


def test_no_c_compiler_is_a_clear_error_before_the_server_starts(tmp_path, monkeypatch):
    from tpserve.server.triton.inprocess_build import build_inprocess

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ServerError, match="C compiler"):
        build_inprocess(tmp_path / "backends")
    assert not (tmp_path / "backends" / "torch_inprocess" / "libtriton_torch_inprocess.so").exists()


def test_the_load_says_which_per_batch_path_each_instance_took(served):
    """On a CPU no instance takes the native path (it needs CUDA graphs); the log says so, with why."""
    spec, state = served
    log = Path(state.log).read_text(errors="replace")
    for model in (STAGED, THREADED):
        assert f"torch_inprocess: {model} instance on cpu: per-batch path Python (only staged engines on a GPU" in log


def _scrape(state) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{state.metrics_port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def _count(text: str, family: str, model: str) -> float:
    """The sum over a model's series of one family (instances, for the histogram) in a scrape."""
    pattern = re.compile(rf'^{family}\{{[^}}]*model="{re.escape(model)}"[^}}]*\}} (\S+)$', re.M)
    return sum(float(v) for v in pattern.findall(text))


def test_the_backend_histogram_counts_every_successful_request(served):
    """torch_inprocess_request_duration_ms (metrics.c): one observation per request answered, by every
    path (Python's per request, the batch calls'); a refused request is not observed."""
    import time

    spec, state = served
    ep = state.endpoint("grpc")
    for model in (STAGED, THREADED, GENERAL):
        shape = (1, 64, 64, 3) if model != GENERAL else (1, 3, 64, 64)
        dtype = np.uint8 if model != GENERAL else np.float32
        for _ in range(3):
            infer(ep, model, {"input": np.zeros(shape, dtype)})
    with pytest.raises(ClientError):
        infer(ep, STAGED, {"input": np.zeros((1, 64, 64, 3), dtype=np.float32)})
    deadline = time.monotonic() + 10
    while True:  # statistics are reported just after the answer: wait for the counters to settle
        text = _scrape(state)
        pairs = {
            m: (
                _count(text, "torch_inprocess_request_duration_ms_count", m),
                _count(text, "nv_inference_request_success", m),
            )
            for m in (STAGED, THREADED, GENERAL)
        }
        if all(h == s for h, s in pairs.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for model, (observed, succeeded) in pairs.items():
        assert observed == succeeded >= 3, (model, pairs)
    buckets = re.findall(
        rf'^torch_inprocess_request_duration_ms_bucket\{{[^}}]*model="{GENERAL}"[^}}]*le="(\S+)"\}}', text, re.M
    )
    assert "+Inf" in buckets and "0.1" in buckets and "10000" in buckets, buckets
    assert _count(text, "torch_inprocess_request_duration_ms_sum", GENERAL) > 0
