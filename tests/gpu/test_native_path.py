"""The in-process backend's native per-batch path (triton_models/inprocess/native/image_path.c) on a GPU host.

A compiled image engine (ResNet-18 at 64x64, fp16, CUDA graphs, uint8 input) served in-process with dynamic
batching: the load says the instance took the native path; requests of several sizes sent at once each get
exactly their own rows (against the same engine through Python's per-batch path); a request of the wrong shape
hears why and the next is answered; CUDA shared memory is served on the same path. Once the server
stops, its log counts the batches: every batch ran natively and no execute entered Python."""

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: run on a GPU host"),
]

from tpserve.builders.build import build_model, build_torch_variant  # noqa: E402
from tpserve.builders.repository.writer import ServingOptions, TorchRuntime  # noqa: E402
from tpserve.builders.request import BuildRequest  # noqa: E402
from tpserve.builders.spec import zoo  # noqa: E402
from tpserve.clients.infer import infer  # noqa: E402
from tpserve.clients.shared_memory import infer_cuda_shm  # noqa: E402
from tpserve.common.errors import ClientError  # noqa: E402
from tpserve.server.triton import launcher  # noqa: E402

SPEC = dict(image_size=64, max_batch_size=16)
COMPILED = dict(channels_last=True, cuda_graphs=True, compiler="inductor", host_outputs=True, uint8_input=True)


@pytest.fixture(scope="module")
def native_served(tmp_path_factory):
    root = tmp_path_factory.mktemp("native")
    spec = zoo.get_spec("resnet18", **SPEC)
    built = zoo.build_module(spec)
    build_model(BuildRequest(spec=spec, target="embedded", repo=root / "scratch", work_dir=root / "work"), built)
    opts = ServingOptions(instances=1, kind="KIND_GPU", max_queue_delay_us=2000)
    names = {}
    for native in (True, False):
        runtime = TorchRuntime(precision="fp16", inprocess=True, native=native, **COMPILED)
        request = BuildRequest(spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work", options=opts)
        names[native] = build_torch_variant(request, runtime)["name"]
    return root, names


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_native_path_serves_every_request_its_own_rows_and_no_python_runs_per_batch(native_served):
    root, names = native_served
    rng = np.random.default_rng(7)
    sizes = [1, 2, 3, 1, 4, 1, 2, 5, 1, 3, 2, 1]
    images = [rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8) for n in sizes]
    with launcher.running(root / "repo", root / "state") as state:
        ep = state.endpoint("grpc")
        # the same engine through Python's per-batch path: the reference for each request's rows
        reference = [infer(ep, names[False], {"input": x}).outputs["logits"] for x in images]
        with ThreadPoolExecutor(len(images)) as pool:  # sent at once: the batcher groups them
            for _ in range(5):
                answers = list(pool.map(lambda x: infer(ep, names[True], {"input": x}).outputs["logits"], images))
                for got, want in zip(answers, reference):
                    assert got.shape == want.shape and _cosines(got, want).min() > 0.9999
        with pytest.raises(ClientError, match=r"unexpected shape for input 'input'"):  # Triton's own check
            infer(state.endpoint("http"), names[True], {"input": np.zeros((1, 32, 32, 3), np.uint8)})
        again = infer(state.endpoint("http"), names[True], {"input": images[0]}).outputs["logits"]
        assert _cosines(again, reference[0]).min() > 0.9999
        shm = infer_cuda_shm(ep, names[True], {"input": images[1]}, {"logits": (np.float32, (2, 1000))})
        assert _cosines(shm["logits"], reference[1]).min() > 0.9999
    text = "\n".join(p.read_text(errors="replace") for p in (root / "state").rglob("tritonserver.log"))
    assert f"{names[True]} instance on cuda:0: per-batch path native" in text, text[-3000:]
    assert f"{names[False]} instance on cuda:0: per-batch path Python (turned off" in text
    (counts,) = re.findall(
        rf"{names[True]}: (\d+) batches \((\d+) requests\) served natively; (\d+) executes entered Python", text
    )
    batches, requests, entered = map(int, counts)
    assert requests >= 5 * len(sizes) + 2 and batches < requests  # and the load's warmup
    assert entered == 0  # no batch entered Python, the one in CUDA shared memory included
