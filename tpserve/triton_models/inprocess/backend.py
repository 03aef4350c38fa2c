"""The in-process torch backend: torch-runtime model folders served inside tritonserver's own process.

The Python backend runs each instance in a stub process: every request crosses shared memory twice and
the instance runs one execute at a time, so nothing overlaps the GPU (docs/gpu/request_profile_h100.md).
Here a small native library (shim.c, built on the serving host) hands Triton's backend entry
points to this module, in an interpreter inside tritonserver:

- inputs are read where Triton holds them (request memory, or the client's CUDA shared memory) and copied
  once onto the device; outputs are written once into the response's own buffers;
- execute() queues the batch on the GPU and returns: a completion thread sends the responses when the
  batch's event fires, so the next batch's copies and Triton's own work overlap this batch's compute
  (two batches in flight per instance, StagedRunner slots);
- statistics (queue, compute input/infer/output) are reported to Triton like any backend's.

A model selects it with `backend: "torch_inprocess"`; its folder is a torch-runtime folder (model.pt2,
spec.json) and its parameters are torch_serving.py's. Everything that fails in here becomes an error
response for the requests concerned (or a failed model load), never a crash of the server.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from typing import Any

from tpserve.triton_models.inprocess.answers import Answers, Slots
from tpserve.triton_models.inprocess.buffers import BackendError, HostRows, as_array, as_tensor, device_bytes
from tpserve.triton_models.inprocess.triton_api import (
    ERROR_UNSUPPORTED,
    KIND_GPU,
    MEMORY_GPU,
    TritonApi,
)

API: TritonApi = None  # type: ignore[assignment]  # set by TRITONBACKEND_Initialize, before any other call
CALLS = None  # the shim's batch calls (triton_models/inprocess/batch_calls.py), where the library has them
_MODELS: dict[int, dict] = {}  # model handle -> {"config", "folder", "name"}
_INSTANCES: dict[int, "Instance"] = {}
_LOADING = threading.Lock()
_DATATYPES: dict = {}  # torch dtype -> Triton datatype, filled at the first instance


def _entry(fn):
    """An entry point returns 0, or a TRITONSERVER_Error's address carrying what went wrong."""

    def wrapped(*args):
        try:
            fn(*args)
            return 0
        except Exception as err:  # the server stays up: the error goes back to Triton
            api = API or TritonApi()
            return api.error(getattr(err, "code", 1), f"torch_inprocess {fn.__name__}: {err}")

    wrapped.__name__ = fn.__name__
    return wrapped


@_entry
def backend_initialize(backend: int) -> None:
    global API, CALLS
    API = TritonApi()
    major, minor = API.api_version()
    if major != 1:
        raise BackendError(f"Triton backend API {major}.{minor}; this backend speaks 1.x", ERROR_UNSUPPORTED)
    from tpserve.triton_models.inprocess import batch_calls

    CALLS = batch_calls.load(API.backend_folder(backend))


@_entry
def backend_finalize(backend: int) -> None:
    pass


@_entry
def model_initialize(model: int) -> None:
    config = json.loads(API.model_config_json(model))
    folder = os.path.join(API.model_repository(model), str(API.model_version(model)))
    _MODELS[model] = {"config": config, "folder": folder, "name": API.string("TRITONBACKEND_ModelName", model)}


@_entry
def model_finalize(model: int) -> None:
    _MODELS.pop(model, None)


@_entry
def instance_initialize(instance: int) -> None:
    import torch  # inside the entry point: tritonserver loads the backend before any model asks for torch

    _prepare_torch()
    kind, device_id = API.instance_placement(instance)
    model = _MODELS[API.instance_model(instance)]
    device = torch.device(f"cuda:{device_id}" if kind == KIND_GPU else "cpu")
    with _LOADING:  # Triton loads models on several threads; torch.export.load and torch.compile are not safe so
        _INSTANCES[instance] = Instance(instance, model, device)


@_entry
def instance_finalize(instance: int) -> None:
    found = _INSTANCES.pop(instance, None)
    if found is not None:
        found.close()


@_entry
def instance_execute(instance: int, requests: int, count: int) -> None:
    handles = list((ctypes.c_void_p * count).from_address(requests))  # Triton keeps the array, not the requests
    _INSTANCES[instance].execute([h for h in handles if h])


def _prepare_torch() -> None:
    """torch.compile compiles in this process (no worker pool started from inside tritonserver); the map from
    torch dtypes to Triton's datatype names."""
    import torch._inductor.config as inductor

    from tpserve.triton_models.runtime.torch_serving import TORCH_DTYPES

    inductor.compile_threads = 1
    _DATATYPES.update({dtype: name.removeprefix("TYPE_") for name, dtype in TORCH_DTYPES.items()})


class Instance:
    """One model instance: the loaded model, its slots and the completion thread."""

    SLOTS = 2

    def __init__(self, handle: int, model: dict, device):
        from tpserve.triton_models.inprocess.tokenize_serving import TokenizeServing, is_tokenize
        from tpserve.triton_models.runtime.ragged_runner import STATS_VARIABLE
        from tpserve.triton_models.runtime.torch_serving import TorchServing

        self.handle, self.name, self.device = handle, model["name"], device
        self.serving: Any  # TorchServing, or TokenizeServing for the text pipeline's first step
        if is_tokenize(model["config"]):  # the text pipeline's first step: no torch module
            self.serving = TokenizeServing(model["config"], model["folder"])
        else:
            stats = os.environ.get(STATS_VARIABLE)  # the server's environment is how the launcher passes it
            self.serving = TorchServing(model["config"], model["folder"], device, slots=self.SLOTS, stats_folder=stats)
        if self.serving.staged and device.type == "cuda":
            with self.serving.on_stream():
                self.serving.runner.use_driver_copies()
        if self.serving.staged:
            wire_shape, wire_dtype = self.serving.wire()
            self.wire = (tuple(wire_shape), _DATATYPES[wire_dtype])
        params = model["config"].get("parameters", {})
        self.inline_rows = int(params.get("inline_rows", {}).get("string_value", INLINE_ROWS))
        from tpserve.triton_models.runtime.input_checks import PARAMETER, InputChecks

        # the spec's declaration (value ranges, lengths, finite inputs), held per request on the general path
        self.checks = InputChecks.from_json(params.get(PARAMETER, {}).get("string_value", ""))
        self.outputs = [(o["name"], o["data_type"].removeprefix("TYPE_")) for o in model["config"]["output"]]
        # which path serves the batches, decided once: the tokenize step, a sequence model, staged engines, or
        # the general path (several inputs, dynamic axes, the CPU)
        self.kind = (
            "tokenize"
            if isinstance(self.serving, TokenizeServing)
            else ("ragged" if self.serving.ragged else ("staged" if self.serving.staged else "general"))
        )
        self.answers = Answers(API, CALLS, handle, self.name, self.outputs, write_output)
        self.slots = Slots(self.SLOTS)
        self.native = self._open_native(handle, device, params.get("native_path", {}).get("string_value") != "0")
        self.python_executes = 0  # batches whose execute entered this module (the native path's: none)
        self.ragged = None  # sequence models: read, run and answered a batch at a time (ragged_path.py)
        if self.kind == "ragged" and CALLS is not None and not self.native:
            from tpserve.triton_models.inprocess.ragged_path import RaggedPath

            self.ragged = RaggedPath(self.serving, self.answers, self.slots, CALLS, API, self.inline_rows)
        self.tokenize = None  # the tokenize step: its batch answered in the shim's batch calls
        if self.kind == "tokenize" and CALLS is not None:
            from tpserve.triton_models.inprocess.tokenize_path import TokenizeBatch

            self.tokenize = TokenizeBatch(self.answers, self.read_and_run, CALLS, API)
        self.thread = threading.local()
        self.worker = threading.Thread(target=self._complete, name=f"{self.name}-responses", daemon=True)
        self.worker.start()

    def _open_native(self, handle: int, device, wanted: bool) -> bool:
        """Whether later batches are served natively, with no Python per batch (image_path.c for the
        image engines, ragged_path.c for sequence models, tokenize_path.c for the text
        pipeline's tokenize step); the load says which path the instance took, and why not the native one."""
        if self.kind == "general" or CALLS is None:
            return False
        from tpserve.triton_models.inprocess import native_path, native_tokenize

        native = "native (no Python per batch)"
        if self.kind == "tokenize":  # a batch with a text it does not read goes to Python, whole
            reason = native_tokenize.open_path(handle, self.serving.tokenizer, self.outputs, CALLS.native, wanted)
            native = "native for texts of printable ASCII, Python for a batch with any other"
        elif self.kind == "ragged":
            reason = native_path.open_ragged(handle, self.serving, device, self.outputs, CALLS.native, wanted)
            if reason is None:  # the runner's statistics file counts what the native side ran
                self.serving.runner.native_counts = lambda: native_path.ragged_counts(handle, CALLS.native)
        else:
            reason = native_path.open_path(handle, self.serving, device, self.outputs, CALLS.native, wanted)
        path = native if reason is None else f"Python ({reason})"
        print(f"torch_inprocess: {self.name} instance on {device}: per-batch path {path}", file=sys.stderr, flush=True)
        return reason is None

    def close(self) -> None:
        if self.native and CALLS is not None:
            self._close_native()
        self.slots.close()
        self.worker.join(timeout=30)
        if self.ragged is not None:
            self.ragged.close()
        if self.kind == "tokenize":  # its child processes
            self.serving.close()

    def _close_native(self) -> None:
        from tpserve.triton_models.inprocess import native_path

        assert CALLS is not None, "a native path opens only where the batch calls loaded"
        if self.kind == "tokenize":
            from tpserve.triton_models.inprocess import native_tokenize

            counted = native_tokenize.counts(self.handle, CALLS.native, close=True)
            native, requests = counted["batches"], counted["requests"]
            steps = f"; {counted['texts']} texts tokenized natively, {counted['python_batches']} batches left to Python"
        elif self.kind == "ragged":
            counted = native_path.ragged_counts(self.handle, CALLS.native, close=True)
            self.serving.runner.native_counts = lambda: counted  # the last statistics file keeps them
            native, requests = counted["batches"], counted["requests"]
            steps = native_path.per_request_us(counted)
        else:
            (native, requests), steps = native_path.counts(self.handle, CALLS.native, close=True), ""
        print(
            f"torch_inprocess: {self.name}: {native} batches ({requests} requests) served natively; "
            f"{self.python_executes} executes entered Python{steps}",
            file=sys.stderr,
            flush=True,
        )

    # --- execute: read, queue on the GPU, hand over
    def execute(self, requests: list[int]) -> None:
        self.python_executes += 1
        if self.ragged is not None:
            return self.ragged.execute(requests)
        start = time.monotonic_ns()
        views, kept = [], []
        for request in requests:
            try:
                views.append(self._views(request))
                kept.append(request)
            except Exception as err:  # this request alone is refused; the others run
                self.answers.fail(request, err, start)
        if not kept:
            return
        if self.tokenize is not None:
            return self.tokenize.execute(kept, views, start)
        if not self.serving.staged:
            return self._run_now(kept, views, start)
        slot, alone = self.slots.take()  # two batches in flight at most: the third waits for the first's answers
        try:
            pending = self._submit([v[0] for v in views], slot, alone)
        except Exception as err:  # the requests are ours now: each one hears why
            self.slots.give(slot)
            return self.answers.fail_all(kept, err, start)
        job = (kept, [v[0].shape[0] for v in views], pending, start, time.monotonic_ns())
        if alone and pending.count <= self.inline_rows:  # nothing to overlap: answer here, no hand-over
            return self._finish(job)
        self.slots.hand_over(job)

    def _views(self, request: int) -> list:
        views = [API.input(request, name) for name in self.serving.input_names]
        if self.serving.staged:
            first, (shape, dtype) = views[0], self.wire
            if first.datatype != dtype or tuple(first.shape[1:]) != shape:
                wanted = ", ".join(map(str, shape))
                raise BackendError(
                    f"input {first.name}: {first.datatype} {list(first.shape)}, expected {dtype} [-1, {wanted}]"
                )
        return views

    def _submit(self, views: list, slot: int, alone: bool):
        """Host rows are copied straight from Triton's buffers into the slot's pinned staging (one memmove per
        buffer, no tensor made); rows in device memory are wrapped and copied device to device."""
        import torch

        from tpserve.triton_models.runtime.torch_runtime import FromHost, Staged

        runner = self.serving.runner
        address, row_bytes = runner.staging(slot)
        direct = alone and runner.raw  # a lone batch's host rows go to the device as they lie in Triton's buffer
        parts: list = []  # FromHost, Staged or a tensor each
        offset, room = 0, runner.buckets[-1]
        for view in views:
            rows = view.shape[0]
            if view.nbytes != rows * row_bytes:
                raise BackendError(f"input {view.name}: {view.nbytes} bytes for {rows} rows of {row_bytes}")
            if offset + rows > room:  # Triton keeps batches within max_batch_size; never write past the staging
                raise BackendError(f"a batch of {offset + rows} rows exceeds the model's largest batch {room}")
            if direct and len(view.chunks) == 1 and view.chunks[0][2] != MEMORY_GPU:
                parts.append(FromHost(rows, view.chunks[0][0]))
            elif all(memory != MEMORY_GPU for _, _, memory, _ in view.chunks):
                at = address + offset * row_bytes
                for chunk, size, _, _ in view.chunks:
                    ctypes.memmove(at, chunk, size)
                    at += size
                parts.append(Staged(rows))
            else:
                parts.append(as_tensor(view, self.device))
            offset += rows
        if runner.shortest(parts, alone):  # no torch context managers: the instance's stream, set once a thread
            if not getattr(self.thread, "stream_set", False):
                torch.cuda.set_stream(self.serving.stream)
                self.thread.stream_set = True
            return runner.submit(parts, slot, alone=True)
        with self.serving.on_stream(), torch.inference_mode():
            return runner.submit(parts, slot, alone=alone)

    def _run_now(self, requests, views, start) -> None:
        """The general path (no CUDA graphs: several inputs, dynamic axes, CPU; the tokenize step): run, then
        answer. A request whose inputs cannot be read is refused alone."""
        results, compute = self.read_and_run(views)
        # where a ragged runner's batch time goes (TRITON_RAGGED_STATS); other runners keep no such record
        spent = getattr(getattr(self.serving, "runner", None), "spent", None)
        ended = time.monotonic_ns()
        for request, result in zip(requests, results):
            if isinstance(result, Exception):
                self.answers.fail(request, result, start)
            else:
                self.answers.answer(request, result, (start, compute, ended))
        rows = sum(v[0].shape[0] for v in views)
        answered = time.monotonic_ns()
        API.report_batch(self.handle, rows, (start, compute, ended, answered))
        if spent is not None:  # where a ragged batch's time goes (TRITON_RAGGED_STATS)
            spent("read inputs (backend)", (compute - start) / 1e9)
            spent("answer requests (backend)", (answered - ended) / 1e9)

    def read_and_run(self, views: list) -> tuple[list, int]:
        """Every request's outputs, or the error that refuses it alone (its inputs unreadable, or the run's own),
        in the order of views; and when the run began (monotonic ns)."""
        from tpserve.triton_models.runtime.input_checks import torch_views

        read, run = (lambda view: as_tensor(view, self.device)), self.serving.run
        if self.kind == "tokenize":  # texts read from Triton's BYTES buffers
            read = self.serving.read
        elif self.kind == "ragged":  # numpy views of Triton's buffers in, arrays out
            read, run = as_array, self.serving.run_arrays
        results: list = [None] * len(views)
        feeds = []
        checks = self.checks if self.kind == "general" else None  # the other paths hold their own
        for index, request_views in enumerate(views):
            try:
                tensors = [read(v) for v in request_views]
                why = checks.why_not(torch_views(self.serving.input_names, tensors)) if checks is not None else None
                if why is not None:
                    raise BackendError(why)
                feeds.append((index, tensors))
            except Exception as err:  # this request alone
                results[index] = err
        compute = time.monotonic_ns()
        try:
            ran = run([feed for _, feed in feeds]) if feeds else []
        except Exception as err:
            ran = [err] * len(feeds)
        for (index, _), result in zip(feeds, ran):
            results[index] = result
        return results, compute

    # --- the completion thread
    def _complete(self) -> None:
        while True:
            job = self.slots.next()
            if job is None:
                return
            if not isinstance(job, tuple):  # a sequence model's batch (ragged_path._Job)
                job.finish()
                continue
            self._finish(job)

    def _finish(self, job) -> None:
        requests, sizes, pending, start, compute = job
        try:
            outputs = self.serving.runner.collect(pending)
            ended = time.monotonic_ns()
            rows_bytes = self.serving.runner.output_row_bytes
            bases = [(o.data_ptr(), row, tuple(o.shape[1:])) for o, row in zip(outputs, rows_bytes)]
            offset = 0
            for request, size in zip(requests, sizes):
                rows = [HostRows(base + offset * row, (size, *dims), size * row) for base, row, dims in bases]
                self.answers.answer(request, rows, (start, compute, ended))
                offset += size
            API.report_batch(self.handle, offset, (start, compute, ended, time.monotonic_ns()))
        except Exception as err:  # the batch failed on the device: every request of it hears why
            self.answers.fail_all(requests, err, start)
        finally:
            self.slots.give(pending.slot)


INLINE_ROWS = 8  # a lone batch this small is answered by execute itself (parameter inline_rows; 0: never)


def write_output(response: int, name: str, datatype: str, tensor) -> None:
    """One output into the response's buffer (host memory, or device memory where the client asked for it)."""
    import numpy as np
    import torch

    if isinstance(tensor, HostRows):
        address, memory, device_id = API.output_buffer(response, name, datatype, tensor.shape, tensor.nbytes, False)
        if memory == MEMORY_GPU:
            source = device_bytes(tensor.address, tensor.nbytes, 0, 0)
            device_bytes(address, tensor.nbytes, memory, device_id).copy_(source)
        elif tensor.nbytes:
            ctypes.memmove(address, tensor.address, tensor.nbytes)
        return
    if isinstance(tensor, np.ndarray):  # host rows (the ragged path): one memmove
        tensor = np.ascontiguousarray(tensor)
        address, memory, device_id = API.output_buffer(response, name, datatype, tensor.shape, tensor.nbytes, False)
        if memory == MEMORY_GPU:
            source = torch.from_numpy(tensor.reshape(-1).view(np.uint8))
            device_bytes(address, tensor.nbytes, memory, device_id).copy_(source)
        elif tensor.nbytes:
            ctypes.memmove(address, tensor.ctypes.data, tensor.nbytes)
        return
    tensor = tensor.contiguous()
    nbytes = tensor.numel() * tensor.element_size()
    address, memory, device_id = API.output_buffer(response, name, datatype, tuple(tensor.shape), nbytes, gpu=False)
    if nbytes == 0:
        return
    if memory != MEMORY_GPU and tensor.device.type == "cpu":  # host to host: one memmove
        ctypes.memmove(address, tensor.data_ptr(), nbytes)
        return
    flat = tensor.view(torch.uint8).reshape(-1) if tensor.dim() else tensor.reshape(1).view(torch.uint8)
    device_bytes(address, nbytes, memory, device_id).copy_(flat)
