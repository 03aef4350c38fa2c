"""Batching across lengths (triton_models/runtime/ragged.py): grids, plans, gathering and splitting."""

import numpy as np
import pytest

from tpserve.triton_models.runtime import ragged


def grid(budget=64):
    return ragged.LengthGrid((4, 8, 16), (1, 2, 4, 8), budget)


def test_grid_cells_stay_within_the_token_budget():
    g = grid(32)
    assert all(rows * length <= 32 for rows, length in g.cells())
    assert (4, 8) in g.cells() and (8, 8) not in g.cells() and (2, 16) in g.cells()
    assert g.rows_for(16) == 2 and g.rows_for(4) == 8


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(lengths=(8, 4), batches=(1, 2)), "ascending"),
        (dict(lengths=(4, 8), batches=(2, 4)), "start at 1"),
        (dict(lengths=(4, 64), batches=(1,), token_budget=32), "below the longest"),
    ],
)
def test_bad_grids_say_what_is_wrong(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ragged.LengthGrid(**kwargs)


def test_default_grid_has_quarter_octave_lengths_and_fine_batch_steps():
    g = ragged.default_grid(256, 48)
    assert g.lengths == (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
    assert ragged.length_steps(16, 300)[-3:] == (224, 256, 300)
    assert ragged.default_grid(10, 4).lengths == (10,)
    assert ragged.exact_grid(g).lengths == (16, 24, 32, 48, 64, 96, 128, 192, 256)  # CPU runs: half octaves
    assert g.batches == (1, 2, 4, 8, 16, 24, 32, 40, 48)
    assert ragged.batch_steps(300)[-6:] == (160, 192, 224, 256, 288, 300)
    assert g.token_budget == 16384
    params = g.to_params()
    assert ragged.grid_from_params(params, 256, 48) == g


def test_row_lengths_come_from_the_last_real_token():
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    assert ragged.row_lengths(mask).tolist() == [2, 4, 1, 3]


def test_plan_groups_rows_by_bucket_under_the_budget():
    lengths = np.array([3, 15, 5, 4, 9, 2, 16, 1, 7])
    groups = ragged.plan(lengths, grid(32))
    seen = np.concatenate([g.rows for g in groups])
    assert sorted(seen.tolist()) == list(range(len(lengths)))  # every row once
    for g in groups:
        assert lengths[g.rows].max() <= g.length and len(g.rows) * g.length <= 32
        assert g.length == min(b for b in (4, 8, 16) if b >= lengths[g.rows].max())
    with pytest.raises(ValueError, match="exceeds the model's longest"):
        ragged.plan(np.array([17]), grid())


def _plan_cost(groups, grid, floor):
    return sum(ragged.run_cost(len(g.rows), g.length, grid, floor) for g in groups)


def test_a_run_floor_merges_small_length_buckets_and_never_costs_more():
    g = ragged.LengthGrid((8, 16, 32, 64), (1, 2, 4, 8, 16, 32), 1024)
    lengths = np.array([3] * 2 + [12] * 3 + [30] * 20 + [60] * 5)
    alone = ragged.plan(lengths, g)
    assert sorted({x.length for x in alone}) == [8, 16, 32, 64]  # no floor: one group per bucket
    merged = ragged.plan(lengths, g, min_run_tokens=256)
    assert len(merged) < len(alone) and {x.length for x in merged} <= {32, 64}
    assert _plan_cost(merged, g, 256) <= _plan_cost(alone, g, 256)
    assert sorted(np.concatenate([x.rows for x in merged]).tolist()) == list(range(len(lengths)))
    for x in merged:
        assert lengths[x.rows].max() <= x.length and len(x.rows) * x.length <= 1024


def test_run_cost_pads_rows_to_their_bucket_and_splits_by_the_budget():
    g = ragged.LengthGrid((8, 16), (1, 2, 4, 8), 64)
    assert ragged.run_cost(3, 16, g, 0) == 4 * 16  # 3 rows run as 4
    assert ragged.run_cost(9, 8, g, 0) == 8 * 8 + 1 * 8  # the budget holds 8 rows of 8
    assert ragged.run_cost(1, 8, g, 100) == 100 + 8  # each run: its launch, then its tokens
    assert ragged.run_cost(9, 8, g, 100) == 2 * 100 + 8 * 8 + 1 * 8  # two runs


def test_a_run_cost_merges_buckets_where_a_launch_costs_more_than_the_padding():
    g = ragged.LengthGrid((8, 16, 32, 64), (1, 2, 4, 8, 16, 32), 4096)
    lengths = np.array([7, 15, 31, 63])  # one row per bucket: padding all to 64 computes 4 * 64 - 116 more tokens
    assert len(ragged.plan(lengths, g, min_run_tokens=1)) == 4  # launches cheap: each bucket its own run
    assert [x.length for x in ragged.plan(lengths, g, min_run_tokens=1000)] == [64]  # one run at the longest


def _requests(rng, sizes_widths):
    feeds = []
    for rows, width in sizes_widths:
        lengths = rng.integers(1, width + 1, rows)
        lengths[0] = width  # padded to its own longest
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        ids = rng.integers(1, 100, (rows, width)) * mask
        feeds.append({"ids": ids, "mask": mask})
    return feeds


def _model(arrays):
    """Per-row function of the real tokens only: the pooled sum, and per-token ids doubled."""
    ids, mask = arrays
    pooled = (ids * mask).sum(axis=1, keepdims=True).astype(np.float32)
    return [pooled, (ids * 2).astype(np.float32)[..., None]]


def test_every_request_gets_exactly_its_own_rows_back():
    rng = np.random.default_rng(0)
    feeds = _requests(rng, [(3, 5), (1, 16), (4, 2), (2, 9)])
    batch = ragged.RaggedBatch(feeds, ["ids", "mask"], "mask")
    counters = ragged.Counters()
    out = ragged.run_exact(batch, grid(), _model, [False, True], counters)
    for feed, (pooled, tokens) in zip(feeds, out):
        alone = _model([feed["ids"], feed["mask"]])
        np.testing.assert_array_equal(pooled, alone[0])
        assert tokens.shape == alone[1].shape
        np.testing.assert_array_equal(tokens * feed["mask"][..., None], alone[1] * feed["mask"][..., None])
    assert counters.rows == 10 and counters.real_tokens == batch.lengths.sum()
    assert 0 < counters.as_dict()["padding_efficiency"] <= 1


def test_requests_answered_as_their_rows_run_get_what_a_whole_batch_gives_short_ones_first():
    rng = np.random.default_rng(1)
    feeds = _requests(rng, [(1, 16), (1, 3), (3, 12), (1, 5), (2, 9)])
    batch = ragged.RaggedBatch(feeds, ["ids", "mask"], "mask")
    whole = ragged.run_exact(batch, grid(), _model, [False, True])
    answered = []
    ragged.run_answering(batch, grid(), _model, [False, True], lambda index, parts: answered.append((index, parts)))
    assert sorted(i for i, _ in answered) == [0, 1, 2, 3, 4]  # each request once
    for index, parts in answered:
        for got, expected in zip(parts, whole[index]):
            np.testing.assert_array_equal(got, expected)
    order = [i for i, _ in answered]
    assert order.index(1) < order.index(0) and order.index(3) < order.index(0)  # 3 and 5 tokens before 16


def test_a_request_without_rows_is_not_answered_row_by_row():
    feeds = [{"ids": np.zeros((0, 4), np.int64), "mask": np.zeros((0, 4), np.int64)}]
    feeds.append({"ids": np.ones((1, 4), np.int64), "mask": np.ones((1, 4), np.int64)})
    batch = ragged.RaggedBatch(feeds, ["ids", "mask"], "mask")
    with pytest.raises(ValueError, match="without rows"):
        ragged.run_answering(batch, grid(), _model, [False, True], lambda index, parts: None)


def test_inputs_of_one_request_must_agree_in_shape():
    with pytest.raises(ValueError, match="one shape"):
        ragged.RaggedBatch([{"ids": np.zeros((2, 3)), "mask": np.zeros((2, 4))}], ["ids", "mask"], "mask")


def test_a_batch_pooled_elsewhere_equals_one_pooled_here():
    feeds = [
        {"ids": np.array([[5, 6, 0]]), "mask": np.array([[1, 1, 0]])},
        {"ids": np.array([[7], [8]]), "mask": np.array([[1], [1]])},
    ]
    made = ragged.RaggedBatch(feeds, ["ids", "mask"], "mask")
    pooled = ragged.RaggedBatch.pooled(made.combined, [1, 2], [3, 1], ["ids", "mask"], "mask")
    assert pooled.lengths.tolist() == made.lengths.tolist() == [2, 1, 1]
    assert made.combined["ids"].tolist() == [[5, 6, 0], [7, 0, 0], [8, 0, 0]]
    outputs = [np.arange(3)[:, None] * np.ones((3, 2))]
    assert [r[0].tolist() for r in pooled.split(outputs, [False])] == [[[0, 0]], [[1, 1], [2, 2]]]


def test_value_bounds_cover_every_integer_input_the_mask_included():
    from tpserve.triton_models.inprocess.ragged_path import value_bounds

    spec = {
        "inputs": [
            {"name": "input_ids", "dtype": "INT64", "value_range": [0, 30522]},
            {"name": "attention_mask", "dtype": "INT64", "value_range": [0, 2]},
            {"name": "token_type_ids", "dtype": "INT64"},
            {"name": "scale", "dtype": "FP32", "value_range": [0.0, 1.0]},
        ]
    }
    assert value_bounds(spec, "attention_mask") == [("input_ids", 0, 30522), ("attention_mask", 0, 2)]
