"""The torch runtime of the embedded target: what torch_model.py runs inside Triton.

Kept apart from model.py so that it is importable, and its bookkeeping testable, without
Triton or a GPU: CUDA-graph buckets (pad a batch up to a captured size, replay, slice),
uint8 images normalized on the device, DLPack exchange with Triton's tensors, and the
compiled engines (torch.compile with inductor, warm-started from the build's portable cache).
"""

from __future__ import annotations

import torch


def bucket_sizes(max_batch: int, explicit: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Batch sizes to capture: the explicit ones, else powers of two up to max_batch, and max_batch."""
    sizes = set(explicit) if explicit else {2**i for i in range(max_batch.bit_length()) if 2**i <= max_batch}
    sizes.add(max_batch)
    if min(sizes) < 1 or max(sizes) > max_batch:
        raise ValueError(f"graph batch sizes {sorted(sizes)} must lie within 1..{max_batch}")
    return tuple(sorted(sizes))


def pick_bucket(batch: int, buckets: tuple[int, ...]) -> int:
    """The smallest captured size that holds the batch."""
    for size in buckets:
        if size >= batch:
            return size
    raise ValueError(f"batch {batch} exceeds the largest captured size {buckets[-1]}")


def capture(fn, static: torch.Tensor | list[torch.Tensor], device):
    """fn(static) captured as a CUDA graph, after warm-up runs on a side stream (cuDNN autotuning happens
    outside the capture); returns the graph and its static outputs. static: a tensor, or one per input."""
    with torch.inference_mode():
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = fn(static)
    return graph, outputs


class GraphRunner:
    """Runs a module through one CUDA graph per bucket size, on static input/output buffers.

    The first input is (sample_shape, dtype); `others` are the (sample shape, dtype) of the inputs after it, each
    with fixed per-sample dims (a tabular model's features and category). On a CPU device nothing is captured: the
    same buffers and bucketing run eagerly, which is what the unit tests exercise.
    """

    def __init__(
        self, module, sample_shape: tuple, dtype, device, buckets: tuple[int, ...], channels_last=False, others=()
    ):
        self.module, self.buckets, self.device = module, buckets, torch.device(device)
        samples = [(tuple(sample_shape), dtype), *[(tuple(shape), kind) for shape, kind in others]]

        def buffer(size, shape, kind):
            fmt = torch.channels_last if channels_last and len(shape) == 3 else torch.contiguous_format
            return torch.zeros((size, *shape), dtype=kind, device=device).to(memory_format=fmt)

        self.inputs = {b: [buffer(b, shape, kind) for shape, kind in samples] for b in buckets}
        self.outputs: dict = {}
        self.graphs: dict = {}
        for size in buckets:
            self._capture(size)

    def _call(self, statics: list):
        return self.module(*statics)

    def _capture(self, size: int) -> None:
        if self.device.type == "cuda":
            self.graphs[size], self.outputs[size] = capture(self._call, self.inputs[size], self.device)

    def __call__(self, *batches: torch.Tensor):
        """The module's output(s) for these inputs (one batch tensor per input, rows alike), copied out of the
        static buffers."""
        count = batches[0].shape[0]
        size = pick_bucket(count, self.buckets)
        statics = self.inputs[size]
        for static, batch in zip(statics, batches, strict=True):
            static[:count].copy_(batch, non_blocking=True)
        if size in self.graphs:
            self.graphs[size].replay()
            out = self.outputs[size]
        else:
            with torch.inference_mode():
                out = self._call(statics)
        if isinstance(out, (tuple, list)):  # the static outputs are overwritten by the next replay
            return [o[:count].clone() for o in out]
        return out[:count].clone()


class StagedRunner:
    """The short request path: one CUDA graph per bucket holding the whole computation from the wire
    tensor to the output dtypes (uint8 normalization, the cast to the precision, channels_last, the
    module, the output casts), fed and drained through reused pinned host buffers.

    Per batch: each request's input is copied once into pinned staging (one memcpy, no torch.cat), one
    asynchronous host-to-device copy lands it on the device, the graph replays, every output is copied
    once into pinned host memory, and one event marks the end. Inputs already on the GPU (CUDA shared
    memory) are copied device to device.

    `slots` batches may be in flight at once (submit, later collect): each slot has its own staging,
    device landing buffer and host outputs, and host-to-device copies run on a copy stream, so that
    the next batch's input crosses the bus while the current one computes. With one slot the input
    lands straight in the graph's static input. On a CPU device nothing is captured or pinned: the
    same steps run eagerly (what the unit tests run).
    """

    def __init__(self, fn, wire_shape: tuple, wire_dtype, device, buckets: tuple[int, ...], slots: int = 1):
        self.fn, self.buckets, self.device = fn, buckets, torch.device(device)
        cuda = self.device.type == "cuda"
        self.inputs = {b: torch.zeros((b, *wire_shape), dtype=wire_dtype, device=device) for b in buckets}
        self.outputs: dict = {}
        self.graphs: dict = {}
        for size in buckets:
            self._capture(size)
        largest, rows = self.outputs[buckets[-1]], (buckets[-1], *wire_shape)
        self.copy_stream = torch.cuda.Stream(self.device) if cuda and slots > 1 else None
        self.raw, self.row_bytes = False, _row_bytes(self.inputs[buckets[0]])
        self.output_row_bytes = [_row_bytes(o) for o in largest]  # per output: the same in every bucket
        self.slots = [
            _Slot(
                staging=torch.empty(rows, dtype=wire_dtype, pin_memory=cuda),
                landing=torch.empty(rows, dtype=wire_dtype, device=device) if self.copy_stream else None,
                host=[torch.empty(o.shape, dtype=o.dtype, pin_memory=cuda) for o in largest],
                done=torch.cuda.Event() if cuda else None,
            )
            for _ in range(slots)
        ]

    def _capture(self, size: int) -> None:
        if self.device.type == "cuda":
            self.graphs[size], self.outputs[size] = capture(self._call, self.inputs[size], self.device)
        else:
            with torch.inference_mode():
                self.outputs[size] = self._call(self.inputs[size])

    def _call(self, batch):
        out = self.fn(batch)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def __call__(self, parts: list) -> list:
        """Run the requests' inputs (one tensor each, host or device) as one batch; host outputs of the batch."""
        return [out.clone() for out in self.collect(self.submit(parts, 0, alone=True))]  # the slot is reused

    def submit(self, parts: list, slot: int, alone: bool = False) -> "Pending":
        """Queue one batch on the current stream through slot `slot` (free: its last batch was collected).

        alone: no other batch is in flight, so host rows may go straight into the graph's input (no copy
        stream, no landing buffer: the shortest path for a lone small request)."""
        count = sum(p.shape[0] for p in parts)
        size, where = pick_bucket(count, self.buckets), self.slots[slot]
        if self.shortest(parts, alone):
            return self._submit_raw(parts, count, size, where, slot)
        static = self.inputs[size]
        self._land(parts, where, static, self.copy_stream if not alone else None)
        if size in self.graphs:
            self.graphs[size].replay()
            outputs = self.outputs[size]
        else:
            with torch.inference_mode():
                outputs = self._call(static)
        for host, out in zip(where.host, outputs):
            host[:count].copy_(out[:count], non_blocking=True)
        if where.done is not None:
            where.done.record()
        return Pending(slot, count)

    def shortest(self, parts: list, alone: bool) -> bool:
        """Whether a batch takes the driver-call path: a lone batch, all of its rows in host memory (staged or
        FromHost), on a runner that uses driver copies."""
        return self.raw and alone and all(isinstance(p, (Staged, FromHost)) for p in parts)

    def _submit_raw(self, parts: list, count: int, size: int, where: "_Slot", slot: int) -> "Pending":
        """A lone batch whose rows are in the staging or at host addresses (FromHost): copies and the closing
        event as driver calls."""
        from tpserve.triton_models.runtime import cuda_driver

        cuda_driver.ensure_context(self.device.index or 0)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        static, staging, offset = self.inputs[size].data_ptr(), where.staging.data_ptr(), 0
        for part in parts:
            nbytes = part.shape[0] * self.row_bytes
            source = part.address if isinstance(part, FromHost) else staging + offset
            cuda_driver.host_to_device(static + offset, source, nbytes, stream)
            offset += nbytes
        self.graphs[size].replay()
        for host, out, row in zip(where.host, self.outputs[size], self.output_row_bytes):
            cuda_driver.device_to_host(host.data_ptr(), out.data_ptr(), count * row, stream)
        cuda_driver.record(where.done.cuda_event, stream)
        return Pending(slot, count)

    def use_driver_copies(self) -> bool:
        """Lone small batches from the staging take driver calls for their copies (CUDA only, contiguous
        outputs, every bucket captured); returns whether they do."""
        from tpserve.triton_models.runtime import cuda_driver

        outputs = [o for size in self.buckets for o in self.outputs[size]]
        cuda = self.device.type == "cuda" and len(self.graphs) == len(self.buckets)
        self.raw = cuda and all(o.is_contiguous() for o in outputs) and cuda_driver.available()
        if self.raw:
            for where in self.slots:  # the events exist from here on (torch makes them at their first record)
                where.done.record()
            torch.cuda.current_stream(self.device).synchronize()
        return self.raw

    def _land(self, parts: list, slot: "_Slot", static: torch.Tensor, copy_stream) -> None:
        """The batch's rows into the graph's static input: host rows through pinned staging (and the copy
        stream's landing buffer when slots overlap), device rows device to device. A Staged part's rows are
        in the staging already (the caller wrote them there)."""
        offset, landed = 0, []  # (start row, rows) that crossed on the copy stream
        cuda = self.device.type == "cuda"
        for part in parts:
            n = part.shape[0]
            host = isinstance(part, Staged) or (part.device.type == "cpu" and cuda)
            if not host:
                static[offset : offset + n].copy_(part, non_blocking=True)
            else:
                rows = slot.staging[offset : offset + n]
                if not isinstance(part, Staged):
                    rows.copy_(part)  # one memcpy into pinned memory
                if copy_stream is None:
                    static[offset : offset + n].copy_(rows, non_blocking=True)
                else:
                    with torch.cuda.stream(copy_stream):
                        slot.landing[offset : offset + n].copy_(rows, non_blocking=True)
                    landed.append((offset, n))
            offset += n
        if landed:  # the host rows, landed on the copy stream while the previous batch computed
            torch.cuda.current_stream(self.device).wait_stream(copy_stream)
            for start, n in landed:
                static[start : start + n].copy_(slot.landing[start : start + n], non_blocking=True)

    def staging(self, slot: int) -> tuple[int, int]:
        """Where a caller may write host rows itself (then pass Staged(rows)): the slot's staging address and
        the bytes of one row."""
        return self.slots[slot].staging.data_ptr(), self.row_bytes

    def collect(self, pending: "Pending") -> list:
        """The batch's host outputs (views of the slot's buffers: valid until the slot is submitted again)."""
        where = self.slots[pending.slot]
        if where.done is not None:
            where.done.synchronize()
        return [host[: pending.count] for host in where.host]


class Staged:
    """A part of a batch whose rows the caller wrote into the slot's staging itself (StagedRunner.staging)."""

    __slots__ = ("shape",)
    device = torch.device("cpu")

    def __init__(self, rows: int):
        self.shape = (rows,)


class FromHost:
    """A lone batch's rows at a host address the caller keeps valid until submit returns (pageable memory: the
    driver copies it before the call returns), copied to the device without the staging."""

    __slots__ = ("shape", "address")
    device = torch.device("cpu")

    def __init__(self, rows: int, address: int):
        self.shape, self.address = (rows,), address


class _Slot:
    __slots__ = ("staging", "landing", "host", "done")

    def __init__(self, staging, landing, host, done):
        self.staging, self.landing, self.host, self.done = staging, landing, host, done


class Pending:
    """A submitted batch: its slot and row count."""

    __slots__ = ("slot", "count")

    def __init__(self, slot: int, count: int):
        self.slot, self.count = slot, count


def _row_bytes(tensor: torch.Tensor) -> int:
    """Bytes of one row (sample) of a batch tensor."""
    return tensor[0].numel() * tensor.element_size()


def load_program(path, device=None) -> torch.nn.Module:
    """A torch.export program as a module that runs on `device` (default: where it was traced).

    An export traced on the CPU may carry the CPU in its graph: device assertions (aten._assert_tensor_metadata
    with device=cpu, from `.to(dtype)` calls in transformers' code), which dynamo refuses once the module is on a
    GPU ("Tensor device mismatch"), and tensors made on the CPU (the attention mask's aranges and fills), which
    meet GPU tensors in attention. The assertions are dropped; tensors made on the traced device are made on
    `device`. Moving the module (module.to) stays the caller's.
    """
    module = strip_device_asserts(torch.export.load(str(path)).module())
    return retarget_devices(module, torch.device(device)) if device is not None else module


def retarget_devices(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """module whose graph(s) make their tensors on `device`: every op that takes a device gets this one (given
    or left to the default, the CPU), and tensor constants the graph reads move there."""
    for graph_module in [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)]:
        changed = False
        for node in graph_module.graph.nodes:
            if node.op == "get_attr":
                _move_constant(graph_module, node.target, device)
            elif node.op == "call_function":
                changed = _retarget_node(node, device) or changed
        if changed:
            graph_module.recompile()
    return module


def _retarget_node(node: torch.fx.Node, device: torch.device) -> bool:
    """The node's device argument, positional (aten.to.device) or keyword (factories, where absent means the
    CPU), set to `device`; whether it changed."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    at = next((i for i, a in enumerate(schema.arguments) if a.name == "device"), None)
    if at is None:
        return False
    if at < len(node.args) and not schema.arguments[at].kwarg_only:
        given = node.args[at]
        if given is None or torch.device(given) == device:  # type: ignore[arg-type]  # an fx argument: a device
            return False
        node.update_arg(at, device)
        return True
    found = node.kwargs.get("device")
    if found is not None and torch.device(found) == device:  # type: ignore[arg-type]  # a device, as above
        return False
    node.update_kwarg("device", device)
    return True


def _move_constant(graph_module: torch.fx.GraphModule, target: str, device: torch.device) -> None:
    owner, _, name = target.rpartition(".")
    holder = graph_module.get_submodule(owner) if owner else graph_module
    value = getattr(holder, name, None)
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.device != device:
        moved = value.to(device)
        if name in holder._buffers:
            holder._buffers[name] = moved
        else:
            setattr(holder, name, moved)


def strip_device_asserts(module: torch.nn.Module) -> torch.nn.Module:
    """module with every aten._assert_tensor_metadata node removed from its graph(s)."""
    target = getattr(torch.ops.aten, "_assert_tensor_metadata", None)
    if target is None:
        return module
    for graph_module in [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)]:
        nodes = [
            n for n in graph_module.graph.nodes if n.op == "call_function" and n.target in (target, target.default)
        ]
        for node in nodes:
            graph_module.graph.erase_node(node)
        if nodes:
            graph_module.recompile()
    return module


TORCH_DTYPES = {  # Triton's config datatypes -> torch
    "TYPE_FP32": torch.float32,
    "TYPE_FP16": torch.float16,
    "TYPE_INT64": torch.int64,
    "TYPE_INT32": torch.int32,
    "TYPE_UINT8": torch.uint8,
    "TYPE_BOOL": torch.bool,
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RECOMPILE_LIMIT = 64  # one graph for batch 1, one dynamic for the rest, more for other axis lengths


def compiled(module, cache: bytes | None = None):
    """module through torch.compile (inductor), its batch axis dynamic above 1.

    Args:
        cache: portable compile artifacts (torch.compiler.save_cache_artifacts at build time),
            loaded first so that compiling reuses the build's kernels instead of starting over.
    """
    from tpserve.triton_models.runtime.private_dirs import keep_inductor_headers_private, use_private_kernel_cache

    env = use_private_kernel_cache()  # the server gives its own; elsewhere ~/.cache/triton-serving, never /tmp's
    keep_inductor_headers_private(env["TORCHINDUCTOR_CACHE_DIR"])
    if cache:
        torch.compiler.load_cache_artifacts(cache)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, RECOMPILE_LIMIT)
    return DynamicBatch(torch.compile(module))


class DynamicBatch:
    """Calls a compiled module with the batch axis of every input marked dynamic (batch 1 stays static).

    One graph then serves every batch size above 1 (no recompilation per bucket); batch 1 gets
    its own, specialized graph, as dynamo specializes sizes 0 and 1 anyway.
    """

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *inputs):
        for tensor in inputs:
            if tensor.dim() and tensor.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return self.fn(*inputs)


def normalize_uint8(images: torch.Tensor, mean, std, dtype, channels_last: bool = False) -> torch.Tensor:
    """NHWC uint8 images -> normalized NCHW in dtype, on the images' device (the GPU, served).

    Two passes over the batch: the cast to dtype (exact: 0..255 fit fp16 and bf16), then one fused
    multiply-add, (x / 255 - mean) / std = x * scale + shift per channel. The NHWC memory already is
    channels_last NCHW, so no copy is made for it. mean and std: sequences, or tensors on the device
    (no copy per call; needed inside a CUDA graph).
    """
    mean_t = torch.as_tensor(mean, device=images.device, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.as_tensor(std, device=images.device, dtype=torch.float32).view(1, -1, 1, 1)
    scale, shift = (1.0 / (255.0 * std_t)).to(dtype), (-mean_t / std_t).to(dtype)
    nchw = torch.addcmul(shift, images.permute(0, 3, 1, 2).to(dtype), scale)
    return nchw.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def from_triton(tensor) -> torch.Tensor:
    """A Triton (pb_utils) tensor as a torch tensor, zero-copy through DLPack (GPU stays GPU)."""
    return torch.utils.dlpack.from_dlpack(tensor.to_dlpack())


def to_dlpack(tensor: torch.Tensor):
    """A torch tensor as a DLPack capsule for pb_utils.Tensor.from_dlpack (zero-copy)."""
    return torch.utils.dlpack.to_dlpack(tensor.contiguous())
