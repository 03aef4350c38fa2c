"""benchmarks/ragged_plan_cost.py: the old run cost it measures against (a floor per run) and its table."""

import numpy as np

from benchmarks.ragged_plan_cost import capped_cost, markdown, variants
from tpserve.triton_models.runtime import ragged


def test_the_old_cost_is_a_floor_and_the_new_one_adds_it():
    g = ragged.LengthGrid((8, 16), (1, 2, 4, 8), 64)
    assert capped_cost(1, 8, g, 100) == 100 and ragged.run_cost(1, 8, g, 100) == 108
    assert capped_cost(8, 8, g, 10) == 64 and ragged.run_cost(8, 8, g, 10) == 74
    assert capped_cost(3, 16, g, 0) == ragged.run_cost(3, 16, g, 0) == 4 * 16  # no floor: the same


def test_the_new_cost_runs_fewer_graphs_on_mixed_lengths():
    g = ragged.LengthGrid((16, 32, 64, 128, 256), (1, 2, 4, 8, 16, 32, 64), 16384)
    lengths = np.random.default_rng(0).lognormal(np.log(40), 0.8, 32).clip(3, 256).astype(int)
    kept = ragged.run_cost
    try:
        ragged.run_cost = capped_cost
        old = ragged.plan(lengths, g, 1000)
    finally:
        ragged.run_cost = kept
    new = ragged.plan(lengths, g, 1000)
    assert len(new) < len(old)
    assert sorted(np.concatenate([x.rows for x in new]).tolist()) == list(range(32))


def test_the_table_has_a_row_per_batch_size_and_a_column_per_plan():
    points = [
        {"rows": rows, "model": model, "floor": floor, "runs": 1.0, "ms_per_batch": 0.5, "per_s": 2000 * rows}
        for rows in (4, 32)
        for _, model, floor in variants(100)
    ]
    table = markdown(points, 100, "a GPU")
    assert "| 4 | 8,000 (1.0, 0.50) |" in table and "| 32 | 64,000" in table
    assert table.splitlines()[4].endswith("| one run |")
