"""Batching across lengths on a real tritonserver (CPU): a sentence encoder from a spec file (transformers'
BertModel, small, random weights, mean pooling in the engine) served by ONNX Runtime and by the compiled
in-process engine, and its text pipeline with the tokenize step in-process.

Requests of different lengths arrive together (the batcher holds them up to 0.3 s), join one batch, and each
gets exactly what it gets alone (fp32); a request that cannot be valid is refused alone; the server stays up.
"""

import dataclasses
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.functional.test_inprocess_backend import _toolchain_missing
from tpserve.builders.__main__ import _write_pipelines
from tpserve.builders.build import build_model, build_torch_variant
from tpserve.builders.repository import pipelines
from tpserve.builders.repository.writer import ServingOptions, TorchRuntime
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import spec_file
from tpserve.clients.admin import inference_statistics
from tpserve.clients.infer import infer
from tpserve.common.errors import ClientError
from tpserve.loadtest.workloads import text as tw
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional
ENCODERS = Path(__file__).parents[2] / "examples" / "text"
SPEC = """
[[model]]
name = "tiny_encoder"
factory = "encoders:bert"
factory_args = { hidden = 64, layers = 2, heads = 4, intermediate = 128 }
python_path = ["."]
max_batch_size = 16
inputs = [
  { name = "input_ids", dtype = "INT64", dims = ["seq"], value_range = [0, 30522] },
  { name = "attention_mask", dtype = "INT64", dims = ["seq"], value_range = [0, 2] },
]
outputs = [ { name = "embedding", dtype = "FP32", dims = [64] } ]
dynamic_axes = { seq = [1, 64] }
pooling = "mean"
tokenizer = "tokenizer.json"
validation_batch_sizes = [1, 3]
"""
ONNX, ENGINE = "tiny_encoder", "tiny_encoder_inductor_fp32_nographs_inproc"
SAME_LENGTH = "tiny_encoder_same_length"  # the ONNX model again, built with ragged_batching off (RAGGED=0)
WAIT = ServingOptions(max_queue_delay_us=300_000)  # concurrent requests surely meet in one batch


@pytest.fixture(scope="module")
def ragged_served(tmp_path_factory):
    missing = _toolchain_missing()
    if missing:
        pytest.skip(missing)
    root = tmp_path_factory.mktemp("ragged")
    from tpserve.builders.spec.zoo.text import model_dir

    (root / "models.toml").write_text(SPEC)
    shutil.copy(ENCODERS / "encoders.py", root / "encoders.py")
    shutil.copy(model_dir() / "tokenizer.json", root / "tokenizer.json")
    (model,) = spec_file.load(root / "models.toml")
    repo, work = root / "repo", root / "work"
    build_model(BuildRequest(spec=model.spec, target="embedded", repo=repo, work_dir=work, options=WAIT))
    _write_same_length(repo, model.spec, work / ONNX / "model.onnx")
    _write_pipelines(repo, model.spec, WAIT)  # what make build-engines does: the spec names a tokenizer
    runtime = TorchRuntime(precision="fp32", compiler="inductor", inprocess=True)
    build_torch_variant(
        BuildRequest(spec=model.spec, target="embedded", repo=repo, work_dir=work, options=WAIT), runtime
    )
    engine_spec = dataclasses.replace(model.spec, name=ENGINE)
    pipelines.write_text_pipeline(repo, engine_spec, model_dir() / "tokenizer.json", WAIT, inprocess=True)
    from tpserve.triton_models.runtime.torch_runtime import load_program

    reference = load_program(work / ONNX / "model.pt2").float()
    with launcher.running(repo, root / "state") as state:
        yield state.endpoint("grpc", repo), reference


def _write_same_length(repo: Path, spec, onnx: Path) -> None:
    from tpserve.builders.repository import writer

    variant = dataclasses.replace(spec, name=SAME_LENGTH)
    config = writer.model_config(variant, "embedded", dataclasses.replace(WAIT, ragged_batching=False))
    writer.write_model(repo, variant, config, {"model.onnx": onnx}, "embedded")


def _requests():
    """Six requests of 1 to 4 sentences, each padded to its own longest (3 to 60 tokens)."""
    lengths = [[3], [60, 7], [12, 12, 30], [5, 41, 9, 22], [17], [2, 33]]
    return [dict(zip(("input_ids", "attention_mask"), tw.token_rows(np.array(x), i))) for i, x in enumerate(lengths)]


def _batched_executions(ep, model: str) -> tuple[int, int]:
    with ep.client() as client:
        (stats,) = inference_statistics(ep, client, model)
    return int(stats["execution_count"]), int(stats["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("model", [ONNX, ENGINE])
def test_mixed_lengths_join_one_batch_and_each_request_gets_its_own_rows(ragged_served, model):
    import torch

    ep, reference = ragged_served
    requests = _requests()
    executions, answered = _batched_executions(ep, model)
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(lambda arrays: infer(ep, model, arrays).outputs["embedding"], requests))
    after, answered_after = _batched_executions(ep, model)
    for _ in range(40):  # the in-process backend reports a request's statistics just after its response
        if answered_after - answered == len(requests):
            break
        time.sleep(0.05)
        after, answered_after = _batched_executions(ep, model)
    assert answered_after - answered == len(requests)
    assert after - executions < len(requests), "requests of different lengths never shared a batch"
    with torch.inference_mode():
        for arrays, got in zip(requests, results):
            alone = reference(*(torch.from_numpy(arrays[n]) for n in ("input_ids", "attention_mask"))).numpy()
            assert got.shape == alone.shape
            np.testing.assert_allclose(got, alone, atol=1e-4, rtol=1e-4)


def test_with_ragged_batching_off_only_requests_of_one_shape_share_a_batch(ragged_served):
    import torch

    ep, reference = ragged_served
    requests = _requests()  # six requests, six shapes
    executions, _ = _batched_executions(ep, SAME_LENGTH)
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(lambda arrays: infer(ep, SAME_LENGTH, arrays).outputs["embedding"], requests))
    for _ in range(40):  # statistics may trail the last response a little
        if _batched_executions(ep, SAME_LENGTH)[0] - executions == len(requests):
            break
        time.sleep(0.05)
    assert _batched_executions(ep, SAME_LENGTH)[0] - executions == len(requests), "two shapes shared a batch"
    with torch.inference_mode():
        for arrays, got in zip(requests, results):
            alone = reference(*(torch.from_numpy(arrays[n]) for n in ("input_ids", "attention_mask"))).numpy()
            np.testing.assert_allclose(got, alone, atol=1e-4, rtol=1e-4)


def test_a_batch_of_many_single_sentence_requests_is_answered_by_two_threads_each_its_own_row(ragged_served):
    """16 requests of one sentence each (the in-process engine sends a batch of 8 or more from two threads):
    every request gets exactly its own row, as computed alone."""
    import torch

    ep, reference = ragged_served
    lengths = [3, 60, 7, 12, 30, 5, 41, 9, 22, 17, 2, 33, 48, 11, 26, 64]
    requests = [
        dict(zip(("input_ids", "attention_mask"), tw.token_rows(np.array([n]), i))) for i, n in enumerate(lengths)
    ]
    executions, _ = _batched_executions(ep, ENGINE)
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(lambda arrays: infer(ep, ENGINE, arrays).outputs["embedding"], requests))
    after, _ = _batched_executions(ep, ENGINE)
    assert after - executions <= len(requests) // 8, "the requests did not meet in batches of 8 or more"
    with torch.inference_mode():
        for arrays, got in zip(requests, results):
            alone = reference(*(torch.from_numpy(arrays[n]) for n in ("input_ids", "attention_mask"))).numpy()
            np.testing.assert_allclose(got, alone, atol=1e-4, rtol=1e-4)
    with ep.client() as client:
        assert client.is_server_live() and client.is_server_ready()


def test_a_request_longer_than_the_model_is_refused_alone(ragged_served):
    ep, _ = ragged_served
    too_long = dict(zip(("input_ids", "attention_mask"), tw.token_rows(np.array([70]))))
    good = _requests()[1]
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(infer, ep, ENGINE, too_long)
        fine = pool.submit(infer, ep, ENGINE, good)
        assert fine.result().outputs["embedding"].shape == (2, 64)
        with pytest.raises(ClientError, match="exceed the model's longest length 64"):
            bad.result()
    with ep.client() as client:
        assert client.is_server_live() and client.is_server_ready()


@pytest.mark.parametrize(
    "arrays, words",
    [
        (
            {"input_ids": np.ones((1, 10), np.int64), "attention_mask": np.ones((1, 12), np.int64)},
            "must have one shape",
        ),
        (
            {"input_ids": np.full((2, 5), 40_000, np.int64), "attention_mask": np.ones((2, 5), np.int64)},
            r"input_ids: values must lie in \[0, 30522\)",
        ),
        (
            {"input_ids": np.full((1, 5), -1, np.int64), "attention_mask": np.ones((1, 5), np.int64)},
            r"values must lie in \[0, 30522\)",
        ),
    ],
    ids=["inputs-disagree", "id-beyond-vocabulary", "negative-id"],
)
def test_a_request_that_cannot_be_valid_is_refused_alone_in_a_shared_batch(ragged_served, arrays, words):
    ep, reference = ragged_served
    good = _requests()[2:4]
    with ThreadPoolExecutor(3) as pool:
        fine = [pool.submit(infer, ep, ENGINE, g) for g in good]
        bad = pool.submit(infer, ep, ENGINE, arrays)
        for request, future in zip(good, fine):
            assert future.result().outputs["embedding"].shape == (len(request["input_ids"]), 64)
        with pytest.raises(ClientError, match=words):
            bad.result()
    assert infer(ep, ENGINE, good[0]).outputs["embedding"].shape == (3, 64)


def test_a_request_outside_the_models_declaration_in_a_shared_batch_fails_alone(ragged_served):
    """The ONNX model holds each request of a batch to the spec's declaration before it runs (ids past the
    vocabulary: refused with the in-process paths' wording, where ONNX Runtime's Gather failed mid-batch before);
    the other requests of the batch are answered."""
    ep, _ = ragged_served
    good = _requests()[1:4]
    bad_ids = {"input_ids": np.full((2, 5), 40_000, np.int64), "attention_mask": np.ones((2, 5), np.int64)}
    with ThreadPoolExecutor(4) as pool:
        fine = [pool.submit(infer, ep, ONNX, g) for g in good]
        bad = pool.submit(infer, ep, ONNX, bad_ids)
        for request, future in zip(good, fine):
            assert future.result().outputs["embedding"].shape == (len(request["input_ids"]), 64)
        with pytest.raises(ClientError, match=r"input input_ids: values must lie in \[0, 30522\)"):
            bad.result()
    assert infer(ep, ONNX, good[0]).outputs["embedding"].shape == (2, 64)


def test_the_in_process_tokenize_step_batches_texts_and_refuses_bad_ones_alone(ragged_served):
    import torch

    from tpserve.builders.spec.zoo.text import SENTENCES, model_dir
    from tpserve.triton_models.runtime.tokenize_core import load_tokenizer, tokenize

    ep, reference = ragged_served
    texts = [list(SENTENCES[i : i + 3]) for i in range(0, 12, 3)] + [["fine", "   "], ["\udcff"]]
    payloads = [np.array([[t.encode("utf-8", "surrogateescape")] for t in request], dtype=object) for request in texts]
    with ThreadPoolExecutor(len(payloads)) as pool:
        futures = [pool.submit(infer, ep, f"{ENGINE}_pipeline", {"TEXT": p}) for p in payloads]
    tokenizer = load_tokenizer(str(model_dir() / "tokenizer.json"), 64)
    for payload, future in zip(payloads[:4], futures[:4]):
        ids, mask = tokenize(tokenizer, [payload.reshape(-1)])[0]
        with torch.inference_mode():
            expected = reference(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(future.result().outputs["EMBEDDING"], expected, atol=1e-4, rtol=1e-4)
    for future, words in ((futures[4], "text 1 is empty or whitespace only"), (futures[5], "not valid UTF-8")):
        with pytest.raises(ClientError, match=words):
            future.result()
    with ep.client() as client:
        assert client.is_server_live() and client.is_server_ready()


def test_the_spec_files_tokenizer_gives_the_onnx_model_a_pipeline_equal_to_the_in_process_one(ragged_served):
    from tpserve.builders.spec.zoo.text import SENTENCES

    ep, _ = ragged_served
    texts = np.array([[t.encode()] for t in SENTENCES[:9]], dtype=object)
    stub = infer(ep, f"{ONNX}_pipeline", {"TEXT": texts}).outputs["EMBEDDING"]
    inprocess = infer(ep, f"{ENGINE}_pipeline", {"TEXT": texts}).outputs["EMBEDDING"]
    np.testing.assert_allclose(stub, inprocess, atol=1e-4, rtol=1e-4)


def test_the_tokenize_step_reads_ascii_texts_natively_as_python_does(ragged_served, tmp_path_factory):
    """Each request alone, so each batch is one request: printable ASCII takes the native path, a text with any
    other character goes to Python whole; both answer exactly what the Python tokenize step gives."""
    from tpserve.builders.spec.zoo.text import SENTENCES, model_dir
    from tpserve.triton_models.runtime.tokenize_core import load_tokenizer, tokenize

    ep, _ = ragged_served
    tokenizer = load_tokenizer(str(model_dir() / "tokenizer.json"), 64)
    ascii_texts = [s for s in SENTENCES if s.isascii()][:6]
    requests = [
        ["Hello, World!! It's 3.14 o'clock..."],
        ["UPPER and lower\tcase,\nlines\r\nand " + "x" * 150 + " words"],
        ascii_texts,
        ["café au lait", "plain words"],  # not ASCII: Python's path
        [" ".join(ascii_texts * 4)],  # truncated to max_length
    ]
    model = f"{ENGINE}_tokenize"
    with ep.client() as client:
        names = [o["name"] for o in client.get_model_metadata(model, as_json=True)["outputs"]]
    for texts in requests:
        payload = np.array([[t.encode()] for t in texts], dtype=object)
        served = infer(ep, model, {"TEXT": payload}).outputs
        ids, mask = tokenize(tokenizer, [payload.reshape(-1)])[0]
        np.testing.assert_array_equal(served[names[0]], ids)
        np.testing.assert_array_equal(served[names[1]], mask)
    logs = [p.read_text(errors="replace") for p in tmp_path_factory.getbasetemp().glob("ragged*/state/*.log")]
    line = f"{model} instance on cpu: per-batch path native for texts of printable ASCII"
    assert any(line in text for text in logs), [text[-2000:] for text in logs]
