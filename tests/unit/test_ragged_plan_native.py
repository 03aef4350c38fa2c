"""The native plan (triton_models/inprocess/native/ragged_plan.c) against ragged.plan: the native path for sequence
models must
group every batch's rows exactly as the Python path does (same rows, same order, same lengths)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tpserve.triton_models import NATIVE
from tpserve.triton_models.inprocess.native_path import MAX_BATCHES, MAX_LENGTHS, grid_struct
from tpserve.triton_models.runtime import ragged


@pytest.fixture(scope="module")
def plan_library(c_library):
    library = c_library(NATIVE / "ragged_plan.c", "ragged_plan")
    pointer = ctypes.POINTER(ctypes.c_int64)
    library.ipr_plan.argtypes = (ctypes.c_void_p, pointer, ctypes.c_int64, pointer, pointer, pointer)
    library.ipr_plan.restype = ctypes.c_int64
    return library


def native_plan(library, grid: ragged.LengthGrid, lengths: np.ndarray, min_run_tokens: int) -> list[ragged.Group]:
    lengths = np.ascontiguousarray(lengths, np.int64)
    n = len(lengths)
    order, group_length, group_count = (np.zeros(max(n, 1), np.int64) for _ in range(3))
    spec = grid_struct(grid, min_run_tokens)

    def at(array):
        return array.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))

    groups = library.ipr_plan(ctypes.byref(spec), at(lengths), n, at(order), at(group_length), at(group_count))
    assert groups >= 0
    found, start = [], 0
    for k in range(groups):
        found.append(ragged.Group(int(group_length[k]), order[start : start + group_count[k]]))
        start += int(group_count[k])
    return found


def assert_same(native: list[ragged.Group], python: list[ragged.Group]) -> None:
    assert [g.length for g in native] == [g.length for g in python]
    assert [g.rows.tolist() for g in native] == [g.rows.tolist() for g in python]


GRIDS = {
    "default 512 x 256": ragged.default_grid(512, 256),
    "default 128 x 64, budget 2048": ragged.default_grid(128, 64, 2048),
    "few buckets": ragged.LengthGrid((8, 32, 64), (1, 4, 16), 256),
    "one bucket": ragged.LengthGrid((16,), (1,), 16),
}


@pytest.mark.parametrize("name", list(GRIDS))
@pytest.mark.parametrize("min_run_tokens", [0, 300, 5000])
def test_the_native_plan_groups_rows_as_ragged_plan_does(plan_library, name, min_run_tokens):
    grid = GRIDS[name]
    rng = np.random.default_rng(len(name) + min_run_tokens)
    for rows in (1, 2, 7, 55, 256, 1000):
        for shape in ("lognormal", "uniform", "all one"):
            if shape == "lognormal":
                lengths = np.clip(rng.lognormal(3.5, 0.6, rows).astype(np.int64), 1, grid.max_length)
            elif shape == "uniform":
                lengths = rng.integers(0, grid.max_length + 1, rows)
            else:
                lengths = np.full(rows, int(rng.integers(1, grid.max_length + 1)), np.int64)
            python = ragged.plan(lengths, grid, min_run_tokens)
            assert_same(native_plan(plan_library, grid, lengths, min_run_tokens), python)


def test_the_native_plan_refuses_a_row_longer_than_the_grid(plan_library):
    grid = GRIDS["few buckets"]
    spec = grid_struct(grid, 0)
    lengths = np.array([3, 65], np.int64)
    out = [np.zeros(2, np.int64) for _ in range(3)]
    pointers = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) for a in (lengths, *out)]
    assert plan_library.ipr_plan(ctypes.byref(spec), pointers[0], 2, *pointers[1:]) == -1


def test_the_grid_bounds_match_the_native_side():
    header = (NATIVE / "ragged_plan.h").read_text()
    assert f"IPR_MAX_LENGTHS = {MAX_LENGTHS}" in header and f"IPR_MAX_BATCHES = {MAX_BATCHES}" in header


def test_a_sequence_model_off_the_gpu_or_turned_off_says_why_it_stays_on_python():
    import types

    import torch

    from tpserve.triton_models.inprocess.native_path import ragged_why_not

    library = types.SimpleNamespace(ipr_open=object())
    runner = types.SimpleNamespace(cuda=False, graphs={}, grid=GRIDS["few buckets"], names=["ids"], per_token=[0])
    serving = types.SimpleNamespace(runner=runner)
    cpu, outputs = torch.device("cpu"), [("embedding", "FP32")]
    assert "turned off" in ragged_why_not(serving, cpu, outputs, library, wanted=False)
    assert "no native path" in ragged_why_not(serving, cpu, outputs, None)
    assert "CUDA graphs on a GPU" in ragged_why_not(serving, cpu, outputs, library)
    assert "CUDA graphs on a GPU" in ragged_why_not(serving, torch.device("cuda", 0), outputs, library)
