"""The user's own data read one way by perf and Locust (clients/given_data.py): rows on the first axis, a request
of batch b the next b rows cycling, and data that cannot fit the model refused before anything is measured."""

import json

import numpy as np
import pytest

from tpserve.clients.given_data import given_rows, request_of
from tpserve.clients.model_plan import ModelPlan, TensorPlan, _parameter
from tpserve.common.errors import ClientError
from tpserve.triton_models.runtime.input_checks import InputChecks

CHECKS = InputChecks(
    ranges={"input_ids": (0, 1000), "attention_mask": (0, 2)},
    axes={"input_ids": ["seq"], "attention_mask": ["seq"]},
    lengths={"seq": (1, 64)},
)


def _plan(max_batch_size=16, checks=CHECKS) -> ModelPlan:
    inputs = (TensorPlan("input_ids", "INT64", (-1,)), TensorPlan("attention_mask", "INT64", (-1,)))
    return ModelPlan(
        name="topic",
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=("logits",),
        checks_json=checks.to_json() if checks else "",
    )


def _npz(tmp_path, rows=64, length=12, **override):
    ids = (np.arange(rows * length).reshape(rows, length) % 1000).astype(np.int64)
    arrays = {"input_ids": ids, "attention_mask": np.ones((rows, length), np.int64), **override}
    np.savez(tmp_path / "data.npz", **arrays)
    return tmp_path / "data.npz"


def test_a_request_of_batch_b_carries_the_next_b_rows_cycling(tmp_path):
    rows = given_rows(_npz(tmp_path, rows=6), _plan(), batch=4)
    assert len(rows) == 6 and rows[0]["input_ids"].shape == (1, 12)
    first, second = request_of(rows, 0, 4), request_of(rows, 1, 4)
    assert first["input_ids"].shape == (4, 12)
    assert [int(r[0]) // 12 for r in second["input_ids"]] == [4, 5, 0, 1]  # rows 4, 5 then round again
    assert request_of(rows, 7, 1)["input_ids"][0, 0] == 12  # batch 1: row 7 % 6 = 1


def test_sixty_four_rows_measured_at_batch_one_are_sixty_four_requests_not_one(tmp_path):
    rows = given_rows(_npz(tmp_path), _plan(), batch=1)
    assert len(rows) == 64 and all(request_of(rows, i, 1)["input_ids"].shape == (1, 12) for i in range(64))


@pytest.mark.parametrize(
    "override, why",
    [
        ({"input_ids": np.full((4, 12), 30000, np.int64)}, "row 0: input input_ids: values must lie in [0, 1000)"),
        ({"input_ids": np.ones((4, 100), np.int64)}, "100 tokens per row exceed the model's longest length 64"),
        ({"input_ids": np.ones((4, 12), np.int32)}, "input input_ids is int32; topic takes INT64 (save it as int64)"),
        ({"input_ids": np.ones((4, 12, 2), np.int64)}, "input input_ids has shape [12, 2]; topic takes [-1] per row"),
        ({"attention_mask": np.ones((3, 12), np.int64)}, "hold different numbers of rows"),
    ],
)
def test_data_that_cannot_fit_the_model_is_refused_with_what_and_where(tmp_path, override, why):
    with pytest.raises(ClientError, match=why.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        given_rows(_npz(tmp_path, rows=4, **override), _plan(), batch=1)


def test_batch_over_the_models_max_batch_size_is_named_before_measuring(tmp_path):
    with pytest.raises(ClientError, match="batch 32 is over topic's max_batch_size 16"):
        given_rows(_npz(tmp_path), _plan(), batch=32)


def test_perf_json_entries_are_rows_and_rows_of_two_shapes_cannot_share_a_request(tmp_path):
    entries = [
        {"input_ids": {"content": [1] * n, "shape": [n]}, "attention_mask": {"content": [1] * n, "shape": [n]}}
        for n in (8, 8, 5)
    ]
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"data": entries}))
    rows = given_rows(path, _plan(), batch=1)
    assert [r["input_ids"].shape for r in rows] == [(1, 8), (1, 8), (1, 5)]
    with pytest.raises(ClientError, match="different shapes, and a request of 2 rows needs one shape"):
        given_rows(path, _plan(), batch=2)


def test_a_model_without_a_batch_axis_takes_the_file_as_one_request(tmp_path):
    np.savez(tmp_path / "one.npz", input_ids=np.ones(12, np.int64), attention_mask=np.ones(12, np.int64))
    rows = given_rows(tmp_path / "one.npz", _plan(max_batch_size=0, checks=None), batch=1)
    assert len(rows) == 1 and request_of(rows, 5, 1, batching=False)["input_ids"].shape == (12,)


def test_the_declaration_is_read_from_the_config_parameter_and_absent_is_none():
    config = {"parameters": {"input_checks": {"string_value": CHECKS.to_json()}}}
    assert _plan(checks=None).checks is None
    assert (
        ModelPlan(
            name="m", max_batch_size=1, inputs=(), outputs=(), checks_json=_parameter(config, "input_checks")
        ).checks
        == CHECKS
    )
    assert _parameter({}, "input_checks") == "" and _parameter({"parameters": {"x": 3}}, "x") == ""
