"""The embedded tritonserver serving what the builders wrote: metadata, numerics, batching, errors."""

import concurrent.futures
import subprocess
import sys

import numpy as np
import pytest
import torch

from tpserve.clients.admin import inference_statistics, repository_index
from tpserve.clients.infer import infer, model_inputs
from tpserve.common.errors import ClientError

pytestmark = pytest.mark.functional
PROTOCOLS = ["http", "grpc"]


def _torch(built, x):
    with torch.no_grad():
        return built.module(torch.from_numpy(x)).numpy()


def _sample(spec, batch, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, *spec.inputs[0].dims)).astype(np.float32)


def _assert_live(served):
    with served.endpoint("http").client() as client:
        assert client.is_server_live() and client.is_server_ready()


def test_models_are_ready_in_the_repository_index(served):
    ep = served.endpoint("http")
    with ep.client() as client:
        index = {m["name"]: m["state"] for m in repository_index(ep, client)}
    expected = (
        "digits_cnn",
        "digits_cnn_int8",
        "resnet18_64",
        "resnet18_64_torch_fp32",
        "resnet18_64_torch_fp32_u8",
        "digits_cnn_pipeline",
        "digits_cnn_pipeline_u8",
        "digits_cnn_preprocess",
        "digits_cnn_preprocess_u8",
        "digits_cnn_postprocess",
        "minilm",
        "minilm_tokenize",
        "minilm_pipeline",
    )
    assert index == {name: "READY" for name in expected}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_config_is_the_written_one(served, protocol):
    ep = served.endpoint(protocol)
    with ep.client() as client:
        config = client.get_model_config("digits_cnn")
    config = config if protocol == "http" else _grpc_dict(config)["config"]
    assert int(config["max_batch_size"]) == 16
    assert config["backend"] == "python"
    assert [int(d) for d in config["input"][0]["dims"]] == [1, 8, 8]
    assert config["instance_group"][0]["count"] == 2
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
    assert config["output"][0]["label_filename"] == "labels.txt"


def _grpc_dict(message):
    from google.protobuf import json_format

    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metadata_shows_the_dynamic_batch_axis(served, protocol):
    ep = served.endpoint(protocol)
    with ep.client() as client:
        (tensor,) = model_inputs(client, "resnet18_64")
    assert tensor["name"] == "input" and tensor["datatype"] == "FP32"
    assert [int(d) for d in tensor["shape"]] == [-1, 3, 64, 64]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["digits_cnn", "resnet18_64"])
def test_outputs_equal_pytorch_for_every_batch_size(served, protocol, model):
    spec, built = served.models[model]
    ep = served.endpoint(protocol)
    with ep.client() as client:
        for batch in range(1, spec.max_batch_size + 1):
            x = _sample(spec, batch, seed=batch)
            got = infer(ep, model, {"input": x}, client=client).outputs["logits"]
            np.testing.assert_allclose(got, _torch(built, x), atol=1e-3, rtol=1e-3, err_msg=f"batch {batch}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_torch_runtime_serves_the_same_numbers(served, protocol):
    spec, built = served.models["resnet18_64"]
    ep = served.endpoint(protocol)
    with ep.client() as client:
        for batch in (1, 3, spec.max_batch_size):
            x = _sample(spec, batch, seed=batch)
            got = infer(ep, "resnet18_64_torch_fp32", {"input": x}, client=client).outputs["logits"]
            np.testing.assert_allclose(got, _torch(built, x), atol=1e-3, rtol=1e-3, err_msg=f"batch {batch}")


def test_uint8_images_are_normalized_inside_the_server(served):
    from PIL import Image

    from tpserve.clients.inputs import preprocess_image

    spec, built = served.models["resnet18_64"]
    pixels = np.random.default_rng(1).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    got = infer(served.endpoint("grpc"), "resnet18_64_torch_fp32_u8", {"input": pixels}).outputs["logits"]
    floats = np.stack([preprocess_image(Image.fromarray(p), spec) for p in pixels])
    np.testing.assert_allclose(got, _torch(built, floats), atol=1e-3, rtol=1e-3)
    assert pixels.nbytes * 4 == floats.nbytes  # what the uint8 input saves on the wire


def test_top_k_of_real_digits_matches_the_labels(served):
    spec, built = served.models["digits_cnn"]
    x, y = built.sample_data["x"][:16], built.sample_data["y"][:16]
    result = infer(served.endpoint("grpc"), "digits_cnn", {"input": x}, top_k=3)
    top1 = [int(ranked[0][2]) for ranked in result.top_k]
    assert np.mean(np.array(top1) == y) >= 0.9
    assert all(len(ranked) == 3 and ranked[0][0] >= ranked[1][0] for ranked in result.top_k)


def test_the_int8_variant_served_keeps_its_accuracy(served):
    from tpserve.builders.spec import zoo

    spec, _ = served.models["digits_cnn"]
    data = zoo.reference_data(spec)
    ep = served.endpoint("grpc")
    accuracy = {}
    with ep.client() as client:
        for model in ("digits_cnn", "digits_cnn_int8"):
            logits = [
                infer(ep, model, {"input": data["x"][i : i + 16]}, client=client).outputs["logits"]
                for i in range(0, len(data["x"]), 16)
            ]
            accuracy[model] = float((np.concatenate(logits).argmax(1) == data["y"]).mean())
    assert accuracy["digits_cnn"] > 0.95
    assert accuracy["digits_cnn"] - accuracy["digits_cnn_int8"] <= 0.01, accuracy


def _stats(served, model):
    ep = served.endpoint("http")
    with ep.client() as client:
        (stats,) = inference_statistics(ep, client, model)
    return stats


def _settled_stats(served, model, timeout: float = 10.0):
    """The model's statistics once they stop moving: Triton records a request's statistics after its response
    is sent, so a read right after the last answer can miss the last few (317 of 320 once on a 2-core host)."""
    import time

    deadline, stats = time.monotonic() + timeout, _stats(served, model)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        again = _stats(served, model)
        if again.get("inference_count") == stats.get("inference_count"):
            return again
        stats = again
    return stats


def test_dynamic_batching_batches_concurrent_requests_on_both_instances(served):
    from tpserve.server.triton.processes import instance_cpu_seconds

    spec, _ = served.models["digits_cnn"]
    before, cpu_before = _settled_stats(served, "digits_cnn"), instance_cpu_seconds("digits_cnn", served.state.pid)
    assert sorted(cpu_before) == ["digits_cnn_0_0", "digits_cnn_0_1"]
    ep = served.endpoint("grpc")
    x = _sample(spec, 1)

    def send(_):
        with ep.client() as client:
            for _ in range(20):
                infer(ep, "digits_cnn", {"input": x}, client=client)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(send, range(16)))
    after = _settled_stats(served, "digits_cnn")
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert inferences == 320
    assert executions < inferences, f"{executions} executions for {inferences} inferences: no batching"
    sizes = [int(b["batch_size"]) for b in after["batch_stats"]]
    assert max(sizes) > 1
    cpu_after = instance_cpu_seconds("digits_cnn", served.state.pid)
    busy = {name: cpu_after[name] - cpu_before[name] for name in cpu_before}
    assert all(seconds > 0 for seconds in busy.values()), f"an instance did no work: {busy}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_requests_are_refused_and_the_server_stays_up(served, protocol):
    from tritonclient.utils import InferenceServerException

    spec, _ = served.models["digits_cnn"]
    ep = served.endpoint(protocol)
    cases = {
        "wrong shape": ("digits_cnn", {"input": np.zeros((1, 1, 9, 9), np.float32)}, ("400", "INVALID_ARG")),
        "wrong dtype": ("digits_cnn", {"input": np.zeros((1, 1, 8, 8), np.int32)}, ("400", "INVALID_ARG")),
        "too big a batch": ("digits_cnn", {"input": _sample(spec, 17)}, ("400", "INVALID_ARG")),
        "unknown model": ("nosuchmodel", {"input": _sample(spec, 1)}, ("400", "404", "NOT_FOUND", "UNAVAILABLE")),
    }
    for name, (model, arrays, statuses) in cases.items():
        with pytest.raises((ClientError, InferenceServerException)) as info:
            infer(ep, model, arrays)
        assert any(s in str(info.value) for s in statuses), f"{name}: {info.value}"
    good = infer(ep, "digits_cnn", {"input": _sample(spec, 2)})
    assert good.outputs["logits"].shape == (2, 10)
    _assert_live(served)


def test_admin_apis_need_the_key_and_the_rest_stays_open(served):
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    with http.InferenceServerClient(served.state.http_url) as client:
        assert client.is_server_ready() and client.get_model_metadata("digits_cnn")["name"] == "digits_cnn"
        for call in (client.get_model_repository_index, client.get_inference_statistics):
            with pytest.raises(InferenceServerException, match="restricted"):
                call()
    _assert_live(served)


def test_client_cli_classifies_a_digit_image(served, tmp_path):
    from PIL import Image

    spec, built = served.models["digits_cnn"]
    image, label = built.sample_data["x"][3, 0], int(built.sample_data["y"][3])
    pixels = ((image * spec.preprocessing.std[0] + spec.preprocessing.mean[0]) * 255).round().astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "digit.png")
    state_dir = str(served.state_dir)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpserve.clients",
            "infer",
            "digits_cnn",
            "--input",
            str(tmp_path / "digit.png"),
            "--top-k",
            "1",
            "--protocol",
            "grpc",
            "--state-dir",
            state_dir,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"sample 0: {label} (" in done.stdout


def test_client_cli_reports_a_bad_model_cleanly(served):
    state_dir = str(served.state_dir)
    done = subprocess.run(
        [sys.executable, "-m", "tpserve.clients", "infer", "nosuchmodel", "--state-dir", state_dir],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr
    _assert_live(served)


def test_digits_cnn_learns_from_real_data(digits_build):
    _, built, result = digits_build
    assert built.metrics["accuracy"] > 0.95
    assert result.metrics["accuracy"] == built.metrics["accuracy"]
