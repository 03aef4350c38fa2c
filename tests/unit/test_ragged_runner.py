"""The ragged runner on the CPU: a small BERT with pooling in the module, mixed lengths in one batch, each
request's embedding equal to unbatched inference (fp32); and device-pinned exports made portable."""

import numpy as np
import pytest
import torch

from tpserve.triton_models.runtime import ragged
from tpserve.triton_models.runtime.ragged_runner import RaggedRunner

transformers = pytest.importorskip("transformers")


def tiny_spec(pooling="mean"):
    from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec

    seq = dict(axes=("seq",), value_range=(0, 1000))
    outputs = (TensorSpec("embedding", "FP32", (64,)),) if pooling else (TensorSpec("tokens", "FP32", (-1, 64)),)
    return ModelSpec(
        name="tiny",
        builder="x",
        inputs=(TensorSpec("input_ids", "INT64", (-1,), **seq), TensorSpec("attention_mask", "INT64", (-1,), **seq)),
        outputs=outputs,
        max_batch_size=8,
        dynamic_axes={"seq": (1, 64)},
        pooling=pooling,
    )


@pytest.fixture(scope="module")
def encoder():
    from tpserve.builders.spec.pooling import pooled

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    bert = transformers.BertModel(config).eval()
    return bert, pooled(bert, tiny_spec())


def _requests(seed=0):
    rng = np.random.default_rng(seed)
    feeds = []
    for rows, width in [(3, 7), (1, 40), (5, 2), (2, 17), (1, 64)]:
        lengths = rng.integers(1, width + 1, rows)
        lengths[0] = width
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        feeds.append({"input_ids": rng.integers(1, 1000, (rows, width)) * mask, "attention_mask": mask})
    return feeds


def _runner(module, per_token):
    grid = ragged.LengthGrid((8, 16, 32, 64), (1, 2, 4, 8), 256)
    inputs = [("input_ids", torch.int64), ("attention_mask", torch.int64)]
    return RaggedRunner(lambda *x: module(*x), inputs, per_token, grid, "cpu", "attention_mask")


def test_mixed_lengths_in_one_batch_match_unbatched_fp32(encoder):
    _, pooled = encoder
    feeds = _requests()
    runner = _runner(pooled, [False])
    with torch.inference_mode():
        out = runner(ragged.RaggedBatch(feeds, ["input_ids", "attention_mask"], "attention_mask"))
        for feed, (embedding,) in zip(feeds, out):
            alone = pooled(torch.from_numpy(feed["input_ids"]), torch.from_numpy(feed["attention_mask"])).numpy()
            assert embedding.shape == alone.shape
            np.testing.assert_allclose(embedding, alone, atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, atol=1e-5)
    info = runner.describe()
    assert info["rows"] == 12 and 0 < info["padding_efficiency"] <= 1


def test_token_outputs_come_back_at_each_requests_length(encoder):
    bert, _ = encoder
    feeds = _requests(1)
    runner = _runner(lambda ids, mask: bert(input_ids=ids, attention_mask=mask).last_hidden_state, [True])
    with torch.inference_mode():
        out = runner(ragged.RaggedBatch(feeds, ["input_ids", "attention_mask"], "attention_mask"))
        for feed, (tokens,) in zip(feeds, out):
            ids, mask = (torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask"))
            alone = bert(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
            real = feed["attention_mask"].astype(bool)
            assert tokens.shape == alone.shape
            np.testing.assert_allclose(tokens[real], alone[real], atol=1e-4, rtol=1e-3)


def test_cpu_exported_programs_lose_their_device_asserts(encoder, tmp_path):
    """An export traced on the CPU pins devices (aten._assert_tensor_metadata); load_program drops them."""
    from tpserve.triton_models.runtime.torch_runtime import load_program

    _, pooled = encoder
    ids = torch.randint(1, 1000, (2, 16))
    mask = torch.ones_like(ids)
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=1, max=64)
    program = torch.export.export(pooled, (ids, mask), dynamic_shapes=(({0: batch, 1: seq}, {0: batch, 1: seq}),))
    asserts = [n for n in program.graph.nodes if "_assert_tensor_metadata" in str(n.target)]
    torch.export.save(program, tmp_path / "model.pt2")
    module = load_program(tmp_path / "model.pt2")
    left = [n for m in module.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes]
    assert asserts, "the export no longer pins devices: this test (and strip_device_asserts) can go"
    assert not [n for n in left if "_assert_tensor_metadata" in str(n.target)]
    with torch.inference_mode():
        torch.testing.assert_close(module(ids, mask), pooled(ids, mask))
    moved = load_program(tmp_path / "model.pt2", "meta")  # tensors the graph makes: on the serving device
    devices = [
        n.kwargs["device"]
        for m in moved.modules()
        if isinstance(m, torch.fx.GraphModule)
        for n in m.graph.nodes
        if n.op == "call_function" and n.kwargs.get("device") is not None
    ]
    assert devices and all(torch.device(d).type == "meta" for d in devices)
    with torch.inference_mode():  # every tensor the graph makes is on the target: nothing meets the CPU
        assert moved.to("meta")(ids.to("meta"), mask.to("meta")).device.type == "meta"
