"""Variable-length inputs on the GPU: CUDA graphs over a grid of (rows x length) cells, fed through pinned buffers.

A dynamic batch's rows (ragged across requests: triton_models/runtime/ragged.py) are grouped by length bucket; each
group is gathered straight into reused pinned staging at its cell's shape, copied to the cell's static inputs,
the cell's graph replays, and its outputs are copied into pinned host buffers. submit() queues all that and
returns; collect() waits for the batch's event and puts the rows back in the batch's order (one scatter per
output), so a server stages the next batch while the GPU runs this one (two slots of buffers). All graphs
share one memory pool, so the memory they hold is about the largest cell's, not the sum (reported as
graph_bytes). On a CPU nothing is captured: groups run eagerly at their own longest row (ragged.run_exact).
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tpserve.triton_models.runtime import ragged

STATS_VARIABLE = "TRITON_RAGGED_STATS"  # the folder of the runners' statistics, as the server passes it


class RaggedRunner:
    """fn(*inputs) -> outputs, run over ragged batches.

    Args:
        fn: the whole computation, from the wire inputs ([rows, length] each) to the outputs in their dtypes.
        inputs: (name, dtype) of every input, in fn's order.
        per_token: per output, whether it has a length axis ([rows, length, ...]) rather than one row per row.
        grid: the length and batch buckets and the token budget.
        mask: the input that marks real tokens ("" : a row is as long as its request).
        graphs: capture CUDA graphs (on a GPU); without them groups run eagerly at their own longest row
            (ragged.run_exact).
        name: the model's name, for the statistics file.
        slots: batches that may be in flight at once (submit/collect); each slot has its own host buffers.

        stats_folder: where a thread writes describe() to <folder>/<name>-<pid>-<id>.json every second (padding
            efficiency, runs, graph memory: what Triton's statistics cannot say); None: nowhere. The server's
            processes are given it as STATS_VARIABLE (server.launcher.ServerSettings.ragged_stats).
    """

    STATS_EVERY_S = 1.0

    def __init__(
        self,
        fn,
        inputs,
        per_token,
        grid,
        device,
        mask="",
        graphs: bool = True,
        name: str = "model",
        slots: int = 1,
        stats_folder: str | None = None,
    ):
        self.fn, self.grid, self.device, self.per_token = fn, grid, torch.device(device), list(per_token)
        self.names, self.dtypes = [n for n, _ in inputs], [d for _, d in inputs]
        self.mask, self.cuda = mask, self.device.type == "cuda" and graphs
        self.counters = ragged.Counters()
        # where a native path serves the batches (ragged_path.c), what it counted: rows, tokens, runs
        self.native_counts: Callable[[], dict[str, int]] | None = None
        self.timings: dict[str, float] = {}  # seconds per step, summed over calls (the backend adds its own)
        self.graphs: dict = {}
        self.static: dict = {}
        self.outputs: dict = {}
        self.graph_bytes, self.capture_seconds, self.min_run_tokens = 0, 0.0, 0
        self.slots = slots
        self.staging = [[torch.empty(0, dtype=d) for d in self.dtypes] for _ in range(slots)]
        self.host: list[list[torch.Tensor]] = []  # per slot, per output
        folder = stats_folder
        self.stats_path = os.path.join(folder, f"{name}-{os.getpid()}-{id(self):x}.json") if folder else None
        if self.cuda:
            self._capture_all()
        else:
            self._warm()
        if self.stats_path:
            self._write_stats()
            threading.Thread(target=_stats_loop, args=(weakref.ref(self),), name=f"{name}-stats", daemon=True).start()

    # --- capture
    def _capture_all(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # memory cached from earlier work would hide what the graphs take
        started, before = time.time(), torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        for rows, length in sorted(self.grid.cells(), key=lambda c: -c[0] * c[1]):  # the largest sizes the pool
            self._capture(rows, length, pool)
        torch.cuda.synchronize(self.device)
        # what compiling during the first captures left cached is not the graphs': handed back before counting
        torch.cuda.empty_cache()
        self.graph_bytes = torch.cuda.memory_reserved(self.device) - before
        self.capture_seconds = round(time.time() - started, 1)
        dtypes = [o.dtype for o in next(iter(self.outputs.values()))]
        self.host = [[torch.empty(0, dtype=d, pin_memory=True) for d in dtypes] for _ in range(self.slots)]
        self.min_run_tokens = self._floor_tokens()

    def _floor_tokens(self, replays: int = 20) -> int:
        """What the smallest run costs, in tokens of the largest one's rate: a replay of a few rows takes about
        as long as this many tokens (launch-bound): what ragged.plan adds to each run's tokens."""
        small = min(self.graphs, key=lambda c: c[0] * c[1])
        large = max(self.graphs, key=lambda c: c[0] * c[1])
        seconds = {}
        for cell in (small, large):
            self.graphs[cell].replay()
            torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            for _ in range(replays):
                self.graphs[cell].replay()
            torch.cuda.synchronize(self.device)
            seconds[cell] = (time.perf_counter() - start) / replays
        rate = large[0] * large[1] / seconds[large]
        return int(seconds[small] * rate)

    def _capture(self, rows: int, length: int, pool) -> None:
        static = [torch.zeros((rows, length), dtype=d, device=self.device) for d in self.dtypes]
        for tensor in static:
            if length > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 1)
        with torch.inference_mode():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._call(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                outputs = self._call(static)
        self.graphs[(rows, length)], self.static[(rows, length)], self.outputs[(rows, length)] = graph, static, outputs

    def _call(self, inputs):
        out = self.fn(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    # --- run
    def __call__(self, batch: ragged.RaggedBatch) -> list[list[np.ndarray]]:
        """Each request's outputs (numpy, host memory)."""
        return batch.split(self.pooled(batch), self.per_token)

    @torch.inference_mode()  # the graphs' static tensors are inference tensors: every caller copies into them
    def pooled(self, batch: ragged.RaggedBatch) -> list[np.ndarray]:
        """The batch's outputs in its row order (collect's form), run now."""
        if not self.cuda:
            return ragged.run_pooled(batch, self.grid, self._eager, self.per_token, self.counters)
        return self.collect(self.submit(batch))

    @torch.inference_mode()
    def submit(self, batch: ragged.RaggedBatch, slot: int = 0) -> "Pending":
        """Queues the batch on the current stream (copies in, replays, copies out) and returns at once; collect()
        waits for it. A slot's staging and host buffers serve one batch at a time: with two slots the next batch
        is staged while this one runs (the caller collects a slot before it submits to it again)."""
        start, start_cpu = time.perf_counter(), time.thread_time()
        groups = ragged.plan(batch.lengths, self.grid, self.min_run_tokens)
        cells = [(self.grid.batch_bucket(len(g.rows)), g.length) for g in groups]
        self._stage(batch, groups, cells, slot)
        staged, staged_cpu = time.perf_counter(), time.thread_time()
        host, flat = self._launch(groups, cells, slot)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self.counters.add(batch.lengths, cells)
        self.spent("plan and stage", staged - start)
        self.spent("launch", time.perf_counter() - staged)
        # this thread's own CPU time in those two steps: the rest of their time it waited (the GIL, a lock, a page)
        self.spent("plan, stage and launch: CPU", time.thread_time() - start_cpu)
        self.spent("plan and stage: CPU", staged_cpu - start_cpu)
        return Pending(batch=batch, groups=groups, host=host, flat=flat, event=event, slot=slot)

    def collect(self, pending: "Pending") -> list[np.ndarray]:
        """The batch's outputs in its row order, [rows, ...] (a per-token output [rows, widest, ...]), once its
        copies have landed: arrays of their own, so the slot is free again when this returns."""
        waited = time.perf_counter()
        pending.event.synchronize()  # releases the GIL while the GPU works
        done = time.perf_counter()
        batch, order = pending.batch, np.concatenate([g.rows for g in pending.groups])
        results = []
        for k, tokens in enumerate(self.per_token):
            if tokens:  # each group has its own length: placed group by group
                results.append(self._placed(batch, pending, k))
            else:  # the groups' rows lie one after another, in plan order: one scatter puts them in batch order
                flat = pending.flat[k].numpy()
                out = np.empty_like(flat)
                out[order] = flat
                results.append(out)
        self.spent("wait for the GPU", done - waited)
        self.spent("place", time.perf_counter() - done)
        return results

    def _placed(self, batch, pending, k: int) -> np.ndarray:
        result: np.ndarray | None = None
        for group, outputs in zip(pending.groups, pending.host):
            result = batch.place(None if result is None else [result], group, [outputs[k].numpy()], [True])[0]
        assert result is not None, "a batch has at least one group"
        return result

    def spent(self, step: str, seconds: float) -> None:
        self.timings[step] = self.timings.get(step, 0.0) + seconds

    def _eager(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        tensors = [torch.from_numpy(a).to(self.device) for a in arrays]
        for tensor in tensors:  # one compiled graph for every length (batch 1 and the rest: torch_runtime)
            if tensor.shape[1] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 1)
        with torch.inference_mode():
            out = self._call(tensors)
        return [o.cpu().numpy() for o in out]

    def _warm(self) -> None:
        """Without graphs: compile now (a lone row and a batch, the length dynamic), not at the first requests."""
        length = min(self.grid.lengths[0], 16)
        for rows in (1, 2):
            self._eager([np.ones((rows, length), np.dtype(str(d).removeprefix("torch."))) for d in self.dtypes])

    def _stage(self, batch, groups, cells, slot: int) -> None:
        """Every group's rows, gathered into the slot's pinned staging at its cell's shape (rows beyond the group
        zeroed)."""
        need, staging = sum(rows * length for rows, length in cells), self.staging[slot]
        for i in range(len(self.names)):
            if staging[i].numel() < need:
                staging[i] = torch.empty(2 * need, dtype=self.dtypes[i], pin_memory=True)
            flat, offset = staging[i].numpy(), 0
            for group, (rows, length) in zip(groups, cells):
                block = flat[offset : offset + rows * length].reshape(rows, length)
                batch.rows(self.names[i], group, out=block)
                block[len(group.rows) :] = 0
                offset += rows * length

    def _launch(self, groups, cells, slot: int):
        """Copies in, replays and copies out for every group, queued on the current stream. Returns each group's
        host views, and per output the host rows of all groups one after another (plan order)."""
        counts = [len(g.rows) for g in groups]
        inner = [tuple(o.shape[1:]) for o in next(iter(self.outputs.values()))]
        staging, host = self.staging[slot], self.host[slot]
        sizes = [self._output_elements(count, cell) for count, cell in zip(counts, cells)]
        self._ensure_host(host, [sum(s[k] for s in sizes) for k in range(len(host))])
        offsets, views_by_group = [0] * len(self.names), []
        out_offsets = [0] * len(host)
        for count, cell, size in zip(counts, cells, sizes):
            rows, length = cell
            for i, static in enumerate(self.static[cell]):
                static.copy_(staging[i][offsets[i] : offsets[i] + rows * length].view(rows, length), non_blocking=True)
                offsets[i] += rows * length
            self.graphs[cell].replay()
            views = []
            for k, out in enumerate(self.outputs[cell]):
                part = out[:count]
                view = host[k][out_offsets[k] : out_offsets[k] + size[k]].view(part.shape)
                view.copy_(part, non_blocking=True)
                out_offsets[k] += size[k]
                views.append(view)
            views_by_group.append(views)
        total = sum(counts)
        flat = [
            None if tokens else host[k][: total * int(np.prod(inner[k]))].view(total, *inner[k])
            for k, tokens in enumerate(self.per_token)
        ]
        return views_by_group, flat

    def _output_elements(self, count: int, cell) -> list[int]:
        return [count * o[0].numel() for o in self.outputs[cell]]

    @staticmethod
    def _ensure_host(host: list, needs: list[int]) -> None:
        for k, need in enumerate(needs):
            if host[k].numel() < need:
                host[k] = torch.empty(2 * need, dtype=host[k].dtype, pin_memory=True)

    def _write_stats(self) -> None:
        assert self.stats_path is not None  # written only where a folder was given
        partial = self.stats_path + ".part"
        with open(partial, "w") as handle:
            json.dump(self.describe(), handle)
        os.replace(partial, self.stats_path)

    def describe(self) -> dict:
        """The grid, the graphs and what the runs computed so far (padding efficiency among it); a native path's
        counts read once, so that its timings, requests and runs are one snapshot."""
        native = self.native_counts() if self.native_counts is not None else {}
        return {
            "length_buckets": list(self.grid.lengths),
            "batch_buckets": list(self.grid.batches),
            "token_budget": self.grid.token_budget,
            "graphs": len(self.graphs),
            "graph_bytes": self.graph_bytes,
            "capture_seconds": self.capture_seconds,
            "min_run_tokens": self.min_run_tokens,
            # seconds per step of a native path (its timers, "native: ..." in native_path.RAGGED_TIMERS)
            "timings_s": {**self.timings, **{k: ns / 1e9 for k, ns in native.items() if k.startswith("native: ")}},
            "requests": int(native.get("requests", 0)),
            **self._counted(native).as_dict(),
        }

    def _counted(self, native: dict) -> ragged.Counters:
        """What the runs computed: this runner's own, and what a native path ran with its graphs (its counts)."""
        if not native:
            return self.counters
        fields = ("rows", "real_tokens", "computed_tokens", "runs", "batches")
        return ragged.Counters(**{f: getattr(self.counters, f) + int(native.get(f, 0)) for f in fields})


@dataclass
class Pending:
    """A batch queued on the GPU: its plan, the host views its outputs land in, and the event that says so."""

    batch: ragged.RaggedBatch
    groups: list
    host: list
    flat: list
    event: torch.cuda.Event
    slot: int


def for_spec(
    module,
    spec: dict,
    grid,
    device,
    out_dtypes,
    graphs: bool,
    name: str = "model",
    slots: int = 1,
    stats_folder: str | None = None,
) -> RaggedRunner:
    """The runner of a sequence model's module: its inputs in the spec's order and dtypes (spec.json's form), the
    mask found by name, its outputs cast to out_dtypes; what the server runs and what the build gates."""
    from tpserve.triton_models.runtime.torch_runtime import TORCH_DTYPES

    inputs = [(i["name"], TORCH_DTYPES[f"TYPE_{i['dtype']}"]) for i in spec["inputs"]]
    per_token = [-1 in o["dims"] for o in spec["outputs"]]
    mask = next((n for n, _ in inputs if "mask" in n), "")

    def whole(*tensors):
        out = module(*tensors)
        return [o.to(d) for o, d in zip(out if isinstance(out, (tuple, list)) else [out], out_dtypes)]

    with torch.inference_mode():
        return RaggedRunner(
            whole,
            inputs,
            per_token,
            grid,
            device,
            mask,
            graphs=graphs,
            name=name,
            slots=slots,
            stats_folder=stats_folder,
        )


def _stats_loop(runner_ref) -> None:
    """Writes a runner's statistics every STATS_EVERY_S while the runner lives (a weak reference: an unloaded
    model's runner and its graphs are freed, and the thread ends)."""
    while True:
        time.sleep(RaggedRunner.STATS_EVERY_S)
        runner = runner_ref()
        if runner is None:
            return
        runner._write_stats()
        del runner
