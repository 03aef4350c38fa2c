"""The in-process backend's path for sequence models: a dynamic batch of requests of any lengths, read, run and
answered with one native call per step, not Python per request.

execute() (Triton's thread) reads every request's inputs in two batch calls (shapes, then one copy of all rows
into pooled arrays), checks them as arrays, and queues the batch on the GPU (RaggedRunner.submit) in a free
slot. The instance's completion thread waits for it and answers every request in one batch call; meanwhile
Triton's thread reads and queues the next batch. A lone small batch is answered inline (no hand-over). On a
CPU the batch runs at once. A request that cannot be valid (wrong datatype, rank or length, inputs that
disagree) is refused alone, with what was wrong; the others run.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tpserve.triton_models.inprocess import batch_calls as bc
from tpserve.triton_models.inprocess.answers import Answers, Slots
from tpserve.triton_models.inprocess.buffers import BackendError, HostRows, as_array, device_bytes
from tpserve.triton_models.inprocess.triton_api import DATATYPES


class RaggedPath:
    """One instance's ragged path.

    Args:
        serving: the instance's TorchServing (a ragged runner).
        answers: how its requests are answered (answers.Answers).
        slots: its batches in flight and the completion thread's queue (answers.Slots).
        calls: the shim's batch calls.
        api: the backend's TritonApi.
        inline_rows: a lone batch up to this many rows is answered by execute itself.
    """

    BACKLOG = 4  # answered batches whose requests may wait for their statistics and release
    SPLIT_AT = 8  # requests in a batch from which two threads send the answers
    RELEASERS = 2  # statistics go one at a time (the model's statistics lock): a second thread releases meanwhile

    def __init__(self, serving, answers: Answers, slots: Slots, calls: bc.BatchCalls, api, inline_rows: int):
        self.answers, self.slots, self.calls, self.api = answers, slots, calls, api
        self.inline_rows = inline_rows
        self.runner, self.serving = serving.runner, serving
        self.names = tuple(serving.input_names)
        spec_inputs = {i["name"]: i["dtype"] for i in serving.spec["inputs"]}
        self.dtypes = np.array([DATATYPES.index(spec_inputs[n]) for n in self.names], np.int32)
        self.numpy = [np.dtype(_NUMPY[spec_inputs[n]]) for n in self.names]
        self.longest = self.runner.grid.max_length
        self.bounds = value_bounds(serving.spec, self.runner.mask)
        self.spent_ns = np.zeros(4, np.uint64)  # the native answers' steps (batch_calls.BatchCalls.answer)
        self.helper_ns = np.zeros(4, np.uint64)  # the same, of the helper's half
        self.helper = ThreadPoolExecutor(1, thread_name_prefix=f"{answers.name}-answers")
        # bounded: where statistics fall behind (they cap a model near 25,000 requests/s), answering waits for them
        self.releases: queue.Queue = queue.Queue(maxsize=self.BACKLOG)
        self.release_ns = [np.zeros(4, np.uint64) for _ in range(self.RELEASERS)]  # each releaser's steps
        self.releasers = [
            threading.Thread(target=self._release_loop, args=(k,), name=f"{answers.name}-releases{k}", daemon=True)
            for k in range(self.RELEASERS)
        ]
        for thread in self.releasers:
            thread.start()
        self.outputs = answers.outputs
        self.contiguous = not any(self.runner.per_token)  # every output one row per row: answered natively

    # --- read
    def execute(self, requests: list[int]) -> None:
        start = time.monotonic_ns()
        handles = np.array(requests, np.uint64)
        found = self.calls.input_shapes(handles, self.names)
        slow = self._read_slow(requests, found, start)
        keep = self._valid(requests, found, slow, start)
        if not keep.any():
            return
        handles, found = handles[keep], _subset(found, keep)
        slow = {i: slow[k] for i, k in enumerate(np.flatnonzero(keep)) if k in slow}
        batch, first_row = self._pool(handles, found, slow)
        handles, batch, first_row = self._in_range(handles, batch, first_row, start)
        if len(handles):
            self._run(handles, batch, first_row, start)

    def _read_slow(self, requests, found: bc.Inputs, start: int) -> dict[int, list[np.ndarray]]:
        """Requests the batch calls left to Python (device memory, or something wrong that Python names)."""
        api, arrays = self.api, {}
        for index in np.flatnonzero(found.status != bc.READ_OK):
            try:
                views = [api.input(requests[index], name) for name in self.names]
                arrays[int(index)] = [as_array(v) for v in views]
                for i, array in enumerate(arrays[index]):
                    found.dtypes[index, i] = DATATYPES.index(views[i].datatype)
                    found.shapes[index, i] = array.shape if array.ndim == 2 else (-1, -1)
            except Exception as err:  # this request alone
                self.answers.fail(requests[index], err, start)
                found.dtypes[index] = -1
        return arrays

    def _valid(self, requests, found: bc.Inputs, slow: dict, start: int) -> np.ndarray:
        """Which requests can run; the others hear why."""
        keep = np.ones(len(requests), bool)
        for index in range(len(requests)):
            if found.dtypes[index, 0] == -1:  # failed while read
                keep[index] = False
                continue
            reason = self._wrong(found.dtypes[index], found.shapes[index])
            if reason:
                self.answers.fail(requests[index], BackendError(reason), start)
                keep[index] = False
        return keep

    def _wrong(self, dtypes: np.ndarray, shapes: np.ndarray) -> str:
        for i, name in enumerate(self.names):
            if dtypes[i] != self.dtypes[i]:
                return f"input {name}: {DATATYPES[dtypes[i]]}, the model takes {DATATYPES[self.dtypes[i]]}"
            if shapes[i][0] < 0:
                return f"input {name}: the model takes [rows, tokens]; send a two-dimensional tensor"
        if (shapes != shapes[0]).any():
            listed = ", ".join(f"{n} {list(s)}" for n, s in zip(self.names, shapes.tolist()))
            return f"the inputs of one request must have one shape: {listed}"
        if shapes[0][1] > self.longest:
            return (
                f"{self.names[0]}: {shapes[0][1]} tokens per row exceed the model's longest length {self.longest}; "
                f"truncate to {self.longest} tokens"
            )
        return ""

    def _pool(self, handles, found: bc.Inputs, slow: dict):
        """Every kept request's rows, one after another, in one [rows, widest] array per input."""
        from tpserve.triton_models.runtime.ragged import RaggedBatch

        sizes, widths = found.shapes[:, 0, 0], found.shapes[:, 0, 1]
        first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        widest = max(int(widths.max()), 1)
        pooled = [np.zeros((int(sizes.sum()), widest), dtype) for dtype in self.numpy]
        self.calls.gather(handles, self.names, found, first_row, pooled)
        for index, arrays in slow.items():
            for out, array in zip(pooled, arrays):
                out[first_row[index] : first_row[index] + len(array), : array.shape[1]] = array
        combined = dict(zip(self.names, pooled))
        batch = RaggedBatch.pooled(combined, sizes.tolist(), widths.tolist(), list(self.names), self.runner.mask)
        return batch, first_row

    def _in_range(self, handles, batch, first_row, start: int):
        """Refuses, alone, a request with a value outside its input's value_range (a token id beyond the
        vocabulary would make the GPU fault, and every request after it fail); the others go on."""
        sizes = np.asarray(batch.sizes, np.int64)
        bad = np.zeros(len(handles), bool)
        reasons = {}
        owner = None  # the request of each row
        for name, low, high in self.bounds:
            rows = batch.combined[name]
            if not len(rows):
                continue
            if low > 0:  # the padding (0) is not a value the request sent
                widths = np.repeat(np.asarray(batch.widths), sizes)
                rows = np.where(np.arange(rows.shape[1]) < widths[:, None], rows, low)
            outside = (rows.min(axis=1) < low) | (rows.max(axis=1) >= high)
            if not outside.any():
                continue
            owner = np.repeat(np.arange(len(handles)), sizes) if owner is None else owner
            starts = np.cumsum([0, *sizes[:-1]])
            per_request = np.bincount(owner[outside], minlength=len(handles)) > 0
            for index in np.flatnonzero(per_request & ~bad):
                row = int(np.flatnonzero(outside[starts[index] : starts[index] + sizes[index]])[0])
                why = f"input {name}: values must lie in [{low}, {high}) (the model's value_range)"
                reasons[index] = f"{why}: row {row}"
            bad |= per_request
        if not bad.any():
            return handles, batch, first_row
        from tpserve.triton_models.runtime.ragged import RaggedBatch

        for index, reason in reasons.items():
            self.answers.fail(int(handles[index]), BackendError(reason), start)
        keep, rows = ~bad, np.repeat(~bad, sizes)
        combined = {name: np.ascontiguousarray(array[rows]) for name, array in batch.combined.items()}
        kept_widths = [int(w) for w, k in zip(batch.widths, keep) if k]
        kept_sizes = sizes[keep]
        first_row = np.concatenate([[0], np.cumsum(kept_sizes)[:-1]]).astype(np.int64)
        kept = RaggedBatch.pooled(combined, kept_sizes.tolist(), kept_widths, batch.names, batch.mask)
        return handles[keep], kept, first_row

    # --- run
    def _run(self, handles, batch, first_row, start: int) -> None:
        runner = self.runner
        if not runner.cuda:  # the CPU: run now, answer now
            compute = time.monotonic_ns()
            try:
                outputs = runner.pooled(batch)
            except Exception as err:
                return self._fail_all(handles, err, start)
            return self.answer(handles, batch, first_row, outputs, (start, compute, time.monotonic_ns()))
        slot, alone = self.slots.take()
        compute = time.monotonic_ns()
        try:
            with self.serving.on_stream():
                pending = runner.submit(batch, slot)
        except Exception as err:
            self.slots.give(slot)
            return self._fail_all(handles, err, start)
        job = _Job(self, handles, batch, first_row, pending, (start, compute))
        if alone and len(batch.lengths) <= self.inline_rows:
            return job.finish()
        self.slots.hand_over(job)

    def finish(self, job: "_Job") -> None:
        try:
            outputs = self.runner.collect(job.pending)
        except Exception as err:  # the batch failed on the device: each of its requests hears why
            return self._fail_all(job.handles, err, job.times[0])
        finally:
            self.slots.give(job.pending.slot)
        self.answer(job.handles, job.batch, job.first_row, outputs, (*job.times, time.monotonic_ns()))

    # --- answer
    def answer(self, handles, batch, first_row, outputs: list[np.ndarray], times: tuple) -> None:
        """Every request its own rows, sent in one batch call (per-token outputs: Python, request by request);
        the release thread then reports their statistics and releases them."""
        answered = time.perf_counter()
        rows = len(batch.lengths)
        if not self.contiguous:
            for handle, result in zip(handles.tolist(), batch.split(outputs, self.runner.per_token)):
                self.answers.answer(handle, result, times)
            self.runner.spent("answer (backend)", time.perf_counter() - answered)
            return self.releases.put((None, None, times, rows))
        arrays = [(name, dtype, np.ascontiguousarray(out)) for (name, dtype), out in zip(self.outputs, outputs)]
        sizes = np.asarray(batch.sizes, np.int64)
        done = self._send(handles, sizes, first_row, arrays)
        self._deferred(done, arrays, first_row, sizes)
        self.runner.spent("answer (backend)", time.perf_counter() - answered)
        self.releases.put((handles, done, times, rows))

    def _send(self, handles, sizes, first_row, arrays) -> bc.Answered:
        """The native answer; a batch of many requests is answered by two threads, half each (Triton's send
        costs about 20 µs a request over gRPC, the most of one thread's time at 25,000 single-sentence requests/s;
        the call releases the GIL)."""
        if len(handles) < self.SPLIT_AT:
            return self.calls.answer(handles, sizes, first_row, arrays, self.spent_ns)
        half = len(handles) // 2
        other = self.helper.submit(
            self.calls.answer, handles[half:], sizes[half:], first_row[half:], arrays, self.helper_ns
        )
        mine = self.calls.answer(handles[:half], sizes[:half], first_row[:half], arrays, self.spent_ns)
        theirs = other.result()
        self.spent_ns[:2] += self.helper_ns[:2]
        self.helper_ns[:] = 0
        fields = [f.name for f in dataclasses.fields(bc.Answered)]  # astuple would deep-copy the arrays
        return bc.Answered(*(np.concatenate([getattr(mine, f), getattr(theirs, f)]) for f in fields))

    def _release_loop(self, k: int) -> None:
        """Statistics and releases, off the answering thread: Triton's per-request statistics cost more than the
        answer itself (its latency summaries), and the client has its response already. Two threads take
        batches in turn: Triton reports one request's statistics at a time (a lock per model), and while one
        thread waits for it the other releases its requests and reports its batch."""
        spent = self.release_ns[k]
        while True:
            job = self.releases.get()
            if job is None:
                return
            handles, done, times, rows = job
            began = time.perf_counter()
            if handles is not None:
                self.calls.release(self.answers.handle, handles, done, times, spent)
                self._note_steps()
            self.api.report_batch(self.answers.handle, rows, (*times, time.monotonic_ns()))
            self.runner.spent("release (backend)", time.perf_counter() - began)

    def _note_steps(self) -> None:
        released = np.sum(self.release_ns, axis=0)  # a new array: each releaser adds to its own
        for step, ns in zip(ANSWER_STEPS, [*self.spent_ns[:2].tolist(), *released[2:].tolist()]):
            self.runner.timings[step] = ns / 1e9

    def close(self) -> None:
        self.helper.shutdown(wait=True)
        for _ in self.releasers:
            self.releases.put(None)
        for thread in self.releasers:
            thread.join(timeout=30)

    def _deferred(self, done: bc.Answered, arrays, first_row, sizes) -> None:
        send_deferred(self.api, self.answers.name, done, arrays, first_row, sizes)

    def _fail_all(self, handles, err: Exception, start: int) -> None:
        self.answers.fail_all(handles.tolist(), err, start)


class _Job:
    """A batch queued on the GPU, waiting for the completion thread."""

    def __init__(self, path: RaggedPath, handles, batch, first_row, pending, times):
        self.path, self.handles, self.batch, self.first_row, self.pending, self.times = (
            path,
            handles,
            batch,
            first_row,
            pending,
            times,
        )

    def finish(self) -> None:
        self.path.finish(self)


ANSWER_STEPS = ("answer: outputs written", "answer: sent", "release: statistics", "release: requests released")


def value_bounds(spec: dict, mask: str) -> list[tuple[str, int, int]]:
    """(name, low, high) of every integer input that has a value_range, the mask included: the values it may carry
    (a mask of 7 where [0, 2) is declared is refused as an id past the vocabulary is)."""
    bounds = []
    for item in spec["inputs"]:
        pair = item.get("value_range")
        if pair and item["dtype"].startswith(("INT", "UINT")):
            bounds.append((item["name"], int(pair[0]), int(pair[1])))
    return bounds


def _subset(found: bc.Inputs, keep: np.ndarray) -> bc.Inputs:
    return bc.Inputs(found.dtypes[keep], found.shapes[keep], found.status[keep])


_NUMPY = {"INT64": "int64", "INT32": "int32", "FP32": "float32", "FP16": "float16", "UINT8": "uint8", "BOOL": "bool"}


def send_deferred(api, name: str, done: bc.Answered, arrays, first_row, sizes) -> None:
    """Requests whose outputs Triton placed in device memory (the client's CUDA shared memory): copied and
    sent here (released with the others)."""
    for index in np.flatnonzero(done.status == bc.DEFERRED):
        response = int(done.responses[index])
        try:
            for k, (_, _, array) in enumerate(arrays):
                address = int(done.addresses[index, k])
                if address:
                    rows = array[first_row[index] : first_row[index] + sizes[index]]
                    host = HostRows(rows.ctypes.data, rows.shape, rows.nbytes)
                    device = device_bytes(address, host.nbytes, 2, int(done.devices[index, k]))
                    device.copy_(device_bytes(host.address, host.nbytes, 0, 0))
            api.send(response)
            done.status[index] = bc.SENT
        except Exception as err:
            api.send(response, api.error(1, f"{name}: {err}"))
            done.status[index] = bc.SENT_ERROR
        done.sent_at[index] = time.monotonic_ns()
