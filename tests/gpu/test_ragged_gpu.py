"""Sequence models on the GPU: CUDA graphs over (rows x length) cells, mixed lengths in one batch, a CPU-traced
export compiled for the GPU, and the served in-process engine against unbatched inference. Run on a GPU host."""

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here: run on a GPU host"),
]

transformers = pytest.importorskip("transformers")

from tpserve.loadtest.workloads import text as tw  # noqa: E402
from tpserve.triton_models.runtime import ragged  # noqa: E402
from tpserve.triton_models.runtime.ragged_runner import RaggedRunner  # noqa: E402

NAMES = ["input_ids", "attention_mask"]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A small BERT with mean pooling, exported on the CPU (as builds do): the device-pinned export."""
    from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
    from tpserve.builders.spec.pooling import pooled

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256
    )
    seq = dict(axes=("seq",), value_range=(0, 30522))
    spec = ModelSpec(
        name="tiny",
        builder="x",
        inputs=(TensorSpec("input_ids", "INT64", (-1,), **seq), TensorSpec("attention_mask", "INT64", (-1,), **seq)),
        outputs=(TensorSpec("embedding", "FP32", (128,)),),
        max_batch_size=64,
        dynamic_axes={"seq": (1, 128)},
        pooling="mean",
    )
    inner = pooled(transformers.BertModel(config, add_pooling_layer=False).eval(), spec)

    class Encoder(torch.nn.Module):  # named inputs, as builds export them
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids, attention_mask)

    module = Encoder().eval()
    ids, mask = (torch.from_numpy(a) for a in tw.token_rows(np.array([16, 9])))
    dims = {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("seq", min=1, max=128)}
    exported = torch.export.export(module, (ids, mask), dynamic_shapes=(dims, dims))
    path = tmp_path_factory.mktemp("ragged") / "model.pt2"
    torch.export.save(exported, path)
    return path, module


def _feeds(seed=0):
    rng = np.random.default_rng(seed)
    feeds = []
    for rows in (3, 1, 17, 8, 32, 2):
        lengths = np.minimum(tw.Lengths(median=30, longest=128, seed=int(rng.integers(1000))).sample(rows), 128)
        ids, mask = tw.token_rows(lengths, int(rng.integers(1000)))
        feeds.append(dict(zip(NAMES, (ids, mask))))
    return feeds


def _runner(module, dtype=torch.float32):
    grid = ragged.default_grid(128, 64, token_budget=4096)
    inputs = [(n, torch.int64) for n in NAMES]
    return RaggedRunner(lambda *x: [module(*x).float()], inputs, [False], grid, "cuda", "attention_mask")


def test_cpu_traced_export_compiles_and_graphs_match_unbatched_fp32(program):
    from tpserve.triton_models.runtime import torch_runtime as rt

    path, reference = program
    engine = rt.compiled(rt.load_program(path, "cuda").to("cuda"))
    runner = _runner(engine)
    feeds = _feeds()
    with torch.inference_mode():
        out = runner(ragged.RaggedBatch(feeds, NAMES, "attention_mask"))
        for feed, (embedding,) in zip(feeds, out):
            alone = reference(*(torch.from_numpy(feed[n]) for n in NAMES)).numpy()
            np.testing.assert_allclose(embedding, alone, atol=2e-4, rtol=1e-3)
    info = runner.describe()
    assert info["graphs"] == len(runner.grid.cells()) and info["rows"] == sum(len(f["input_ids"]) for f in feeds)
    assert 0 < info["graph_bytes"] < 2 * 2**30 and info["min_run_tokens"] > 0
    assert 0 < info["padding_efficiency"] <= 1


def test_fp16_graphs_stay_within_cosine_of_fp32(program):
    from tpserve.triton_models.runtime import torch_runtime as rt

    path, reference = program
    runner = _runner(rt.compiled(rt.load_program(path, "cuda").to("cuda", dtype=torch.float16)))
    feeds = _feeds(1)
    with torch.inference_mode():
        out = runner(ragged.RaggedBatch(feeds, NAMES, "attention_mask"))
        for feed, (embedding,) in zip(feeds, out):
            alone = reference(*(torch.from_numpy(feed[n]) for n in NAMES)).numpy()
            cosine = np.sum(embedding * alone, axis=1) / np.linalg.norm(embedding, axis=1)
            assert cosine.min() >= 0.999
