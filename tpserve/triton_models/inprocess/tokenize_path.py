"""The tokenize step's batch answered in native batch calls, as the ragged engine's is.

Answered request by request, each response costs the server's interpreter about ten ctypes calls, and each
call lets go of the GIL and takes it back: beside an engine that needs the same GIL, that is the most of the
step's cost in the server (docs/benchmarks.md, runs J-J3). Here every request's rows are padded to the batch's
widest text and the batch is answered, then released with its statistics, in two calls of the shim
(batch_calls.py). The engine reads real lengths from the attention mask, so the wider padding changes nothing
downstream. A request refused (bad UTF-8, an empty text) hears why alone, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tpserve.triton_models.inprocess import batch_calls as bc
from tpserve.triton_models.inprocess.answers import Answers
from tpserve.triton_models.inprocess.ragged_path import send_deferred


def pad_together(results: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every request's (ids, mask) [rows, own width] as two arrays [all rows, widest] and each request's rows."""
    if len(results) == 1:  # a lone request: its arrays as they are
        ids, mask = results[0]
        return np.ascontiguousarray(ids), np.ascontiguousarray(mask), np.array([ids.shape[0]], np.int64)
    rows = np.array([ids.shape[0] for ids, _ in results], np.int64)
    widest = max((ids.shape[1] for ids, _ in results), default=1)
    ids_all = np.zeros((int(rows.sum()), widest), np.int64)
    mask_all = np.zeros_like(ids_all)
    at = 0
    for (ids, mask), count in zip(results, rows.tolist()):
        ids_all[at : at + count, : ids.shape[1]] = ids
        mask_all[at : at + count, : mask.shape[1]] = mask
        at += count
    return ids_all, mask_all, rows


class TokenizeBatch:
    """Runs and answers a tokenize instance's batches (Instance.execute hands them over). read_and_run(views):
    every request's (ids, mask) or the error that refuses it alone, and when the run began."""

    def __init__(self, answers: Answers, read_and_run: Callable, calls: bc.BatchCalls, api):
        self.answers, self.read_and_run, self.calls, self.api = answers, read_and_run, calls, api
        self.spent_ns = np.zeros(4, np.uint64)

    def execute(self, requests: list[int], views: list, start: int) -> None:
        results, compute = self.read_and_run(views)
        good = []
        for request, result in zip(requests, results):
            if isinstance(result, Exception):  # this request alone
                self.answers.fail(request, result, start)
            else:
                good.append((request, result))
        if good:
            self._answer(np.array([g[0] for g in good], np.uint64), [g[1] for g in good], start, compute)

    def _answer(self, handles: np.ndarray, results: list, start: int, compute: int) -> None:
        try:
            ids, mask, rows = pad_together(results)
            ended = time.monotonic_ns()
            first_row = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
            arrays = [(name, dtype, array) for (name, dtype), array in zip(self.answers.outputs, (ids, mask))]
        except Exception as err:  # nothing answered yet: every request hears why
            return self.answers.fail_all(handles.tolist(), err, start)
        done = self.calls.answer(handles, rows, first_row, arrays, self.spent_ns)
        send_deferred(self.api, self.answers.name, done, arrays, first_row, rows)  # the client's device memory
        self.calls.release(self.answers.handle, handles, done, (start, compute, ended), self.spent_ns)
        self.api.report_batch(self.answers.handle, int(rows.sum()), (start, compute, ended, time.monotonic_ns()))
