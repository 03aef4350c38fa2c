"""The in-process backend's native per-batch path (image_path.c), opened for one instance at load.

Python builds the engine, captures its CUDA graphs and knows their buffers; this module hands the native side
what it needs to serve every later batch alone: each bucket's graph executable (torch's
`CUDAGraph.raw_cuda_graph_exec()`), the device addresses of its static input and outputs, the instance's
stream, and the input's and outputs' names, datatypes and shapes. From then on Triton's execute for that
instance runs no Python, inputs in GPU memory (CUDA shared memory) included.

Which models take it: a staged runner on a GPU (one fixed-shape input, a graph for every bucket, contiguous
outputs): the image engines (image_path.c); and a ragged runner under CUDA graphs: sequence models, pooled
or per-token outputs (ragged_path.c, its plan ragged_plan.c). The tokenize step has a native path of
its own for BERT-style tokenizers (native_tokenize.py); `why_not` and `ragged_why_not` say why a model cannot take
this one, and the instance's load says which path it took.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char, c_int32, c_int64, c_uint32, c_uint64

from tpserve.triton_models.inprocess.triton_api import DATATYPES

MAX_DIMS, MAX_OUTPUTS, MAX_BUCKETS = 8, 8, 32  # the C side's IPN_MAX_*


class Spec(ctypes.Structure):
    """ipn_spec, field by field."""

    _fields_ = [
        ("device", c_int32),
        ("stream", c_uint64),
        ("input_name", c_char * 128),
        ("input_dtype", c_int32),
        ("input_dims", c_uint32),
        ("input_shape", c_int64 * MAX_DIMS),
        ("input_row_bytes", c_uint64),
        ("buckets", c_uint32),
        ("bucket_rows", c_int64 * MAX_BUCKETS),
        ("graphs", c_uint64 * MAX_BUCKETS),
        ("static_inputs", c_uint64 * MAX_BUCKETS),
        ("static_outputs", (c_uint64 * MAX_OUTPUTS) * MAX_BUCKETS),
        ("outputs", c_uint32),
        ("output_names", (c_char * 128) * MAX_OUTPUTS),
        ("output_dtypes", c_int32 * MAX_OUTPUTS),
        ("output_dims", c_uint32 * MAX_OUTPUTS),
        ("output_shapes", (c_int64 * MAX_DIMS) * MAX_OUTPUTS),
        ("output_row_bytes", c_uint64 * MAX_OUTPUTS),
    ]


REASONS = {
    1: "the CUDA driver (libcuda.so.1) could not be loaded",
    2: "the device's context could not be made current",
    3: "pinned memory or events could not be made",
    4: "no room for another instance",
    5: "its completion thread could not start",
    6: "the model's shape is outside the native path's bounds",
}


def why_not(serving, device, outputs: list[tuple[str, str]], library, wanted: bool = True) -> str | None:
    """Why this instance cannot take the native path (None: it can). wanted: the config's native_path."""
    runner = getattr(serving, "runner", None)
    if not wanted:
        return "turned off by the model's config (native_path 0)"
    if library is None or not hasattr(library, "ipn_open"):
        return "the backend library has no native path"
    if device.type != "cuda" or not getattr(serving, "staged", False) or runner is None:
        return "only staged engines on a GPU (CUDA graphs, one fixed-shape input) take it"
    if getattr(serving, "ragged", False):
        return "sequence models batch across lengths in Python"
    if len(serving.input_names) != 1 or not runner.raw:
        return "one input and driver copies are needed"
    if len(runner.graphs) != len(runner.buckets) or len(runner.buckets) > MAX_BUCKETS:
        return "every bucket needs a captured graph"
    if not 0 < len(outputs) <= MAX_OUTPUTS or any(o.dim() - 1 > MAX_DIMS for o in runner.outputs[runner.buckets[-1]]):
        return "too many outputs or dims"
    return None


def spec_for(serving, device, outputs: list[tuple[str, str]]) -> Spec:
    """The spec of a staged runner (why_not returned None for it)."""
    runner = serving.runner
    wire_shape, _ = serving.wire()
    spec = Spec()
    spec.device = device.index or 0
    spec.stream = serving.stream.cuda_stream
    spec.input_name = serving.input_names[0].encode()
    first = runner.inputs[runner.buckets[0]]
    spec.input_dtype = _dtype(first.dtype)
    spec.input_dims = len(wire_shape)
    for d, size in enumerate(wire_shape):
        spec.input_shape[d] = size
    spec.input_row_bytes = runner.row_bytes
    spec.buckets = len(runner.buckets)
    for k, size in enumerate(runner.buckets):
        spec.bucket_rows[k] = size
        spec.graphs[k] = runner.graphs[size].raw_cuda_graph_exec()
        spec.static_inputs[k] = runner.inputs[size].data_ptr()
        for o, tensor in enumerate(runner.outputs[size]):
            spec.static_outputs[k][o] = tensor.data_ptr()
    spec.outputs = len(outputs)
    largest = runner.outputs[runner.buckets[-1]]
    for o, ((name, datatype), tensor) in enumerate(zip(outputs, largest)):
        spec.output_names[o].value = name.encode()
        spec.output_dtypes[o] = DATATYPES.index(datatype)
        spec.output_dims[o] = tensor.dim() - 1
        for d, size in enumerate(tensor.shape[1:]):
            spec.output_shapes[o][d] = size
        spec.output_row_bytes[o] = runner.output_row_bytes[o]
    return spec


def _dtype(torch_dtype) -> int:
    from tpserve.triton_models.runtime.torch_serving import TORCH_DTYPES

    name = next(n for n, d in TORCH_DTYPES.items() if d == torch_dtype).removeprefix("TYPE_")
    return DATATYPES.index(name)


def open_path(handle: int, serving, device, outputs: list[tuple[str, str]], library, wanted: bool = True) -> str | None:
    """Open the native path for instance `handle`; None when it serves from now on, else why not."""
    reason = why_not(serving, device, outputs, library, wanted)
    if reason is not None:
        return reason
    serving.stream.synchronize()  # the graphs and buffers are whole before the native side reads them
    spec = spec_for(serving, device, outputs)
    library.ipn_open.argtypes, library.ipn_open.restype = (ctypes.c_void_p, ctypes.POINTER(Spec)), ctypes.c_int
    code = library.ipn_open(handle, ctypes.byref(spec))
    return None if code == 0 else REASONS.get(code, f"ipn_open returned {code}")


def counts(handle: int, library, close: bool = False) -> tuple[int, int]:
    """(batches served natively, their requests); close: stop the path too."""
    found = (c_uint64 * 2)()
    function = library.ipn_close if close else library.ipn_counts
    function.argtypes, function.restype = (ctypes.c_void_p, ctypes.POINTER(c_uint64 * 2)), None
    function(handle, ctypes.byref(found))
    return found[0], found[1]


# --- sequence models (ragged_path.c): a dynamic batch of any lengths under the grid's CUDA graphs

MAX_INPUTS, MAX_LENGTHS, MAX_BATCHES, MAX_CELLS = 4, 64, 64, 1024  # the C side's IPR_MAX_*


class Grid(ctypes.Structure):
    """ipr_grid (ragged_plan.h): ragged.LengthGrid as the native plan reads it."""

    _fields_ = [
        ("lengths", c_uint32),
        ("length_buckets", c_int64 * MAX_LENGTHS),
        ("rows_at", c_int64 * MAX_LENGTHS),
        ("batches", c_uint32),
        ("batch_buckets", c_int64 * MAX_BATCHES),
        ("min_run_tokens", c_int64),
    ]


def grid_struct(grid, min_run_tokens: int) -> Grid:
    """The native form of a ragged.LengthGrid (its buckets within MAX_LENGTHS and MAX_BATCHES)."""
    found = Grid()
    found.lengths, found.batches, found.min_run_tokens = len(grid.lengths), len(grid.batches), min_run_tokens
    for k, length in enumerate(grid.lengths):
        found.length_buckets[k], found.rows_at[k] = length, grid.rows_for(length)
    for k, rows in enumerate(grid.batches):
        found.batch_buckets[k] = rows
    return found


class RaggedSpec(ctypes.Structure):
    """ipr_spec, field by field."""

    _fields_ = [
        ("device", c_int32),
        ("stream", c_uint64),
        ("grid", Grid),
        ("inputs", c_uint32),
        ("input_names", (c_char * 128) * MAX_INPUTS),
        ("input_dtypes", c_int32 * MAX_INPUTS),
        ("input_bytes", c_uint32 * MAX_INPUTS),
        ("mask", c_int32),
        ("bounded", c_int32 * MAX_INPUTS),
        ("low", c_int64 * MAX_INPUTS),
        ("high", c_int64 * MAX_INPUTS),
        ("cell_of", (c_int32 * MAX_BATCHES) * MAX_LENGTHS),
        ("cells", c_uint32),
        ("graphs", c_uint64 * MAX_CELLS),
        ("static_inputs", (c_uint64 * MAX_INPUTS) * MAX_CELLS),
        ("static_outputs", (c_uint64 * MAX_OUTPUTS) * MAX_CELLS),
        ("outputs", c_uint32),
        ("output_names", (c_char * 128) * MAX_OUTPUTS),
        ("output_dtypes", c_int32 * MAX_OUTPUTS),
        ("per_token", c_int32 * MAX_OUTPUTS),
        ("output_dims", c_uint32 * MAX_OUTPUTS),
        ("output_shapes", (c_int64 * MAX_DIMS) * MAX_OUTPUTS),
        ("output_unit_bytes", c_uint64 * MAX_OUTPUTS),
    ]


def ragged_why_not(serving, device, outputs: list[tuple[str, str]], library, wanted: bool = True) -> str | None:
    """Why this sequence model's instance cannot take the native path (None: it can)."""
    runner = getattr(serving, "runner", None)
    if not wanted:
        return "turned off by the model's config (native_path 0)"
    if library is None or not hasattr(library, "ipr_open"):
        return "the backend library has no native path for sequence models"
    if device.type != "cuda" or runner is None or not getattr(runner, "cuda", False) or not runner.graphs:
        return "only sequence models under CUDA graphs on a GPU take it (the config's cuda_graphs 1)"
    grid = runner.grid
    if len(grid.lengths) > MAX_LENGTHS or len(grid.batches) > MAX_BATCHES or len(runner.graphs) > MAX_CELLS:
        return f"the grid is larger than the native path's bounds ({MAX_LENGTHS} lengths, {MAX_BATCHES} batches)"
    if not 0 < len(runner.names) <= MAX_INPUTS or not 0 < len(outputs) <= MAX_OUTPUTS:
        return f"at most {MAX_INPUTS} inputs and {MAX_OUTPUTS} outputs"
    first = next(iter(runner.outputs.values()))
    if any(o.dim() - 1 - tokens > MAX_DIMS for o, tokens in zip(first, runner.per_token)):
        return "an output has too many dims"
    return None


def ragged_spec_for(serving, device, outputs: list[tuple[str, str]]) -> RaggedSpec:
    """The spec of a ragged runner under graphs (ragged_why_not returned None for it)."""
    from tpserve.triton_models.inprocess.ragged_path import value_bounds

    runner = serving.runner
    spec = RaggedSpec()
    spec.device, spec.stream = device.index or 0, serving.stream.cuda_stream
    spec.grid = grid_struct(runner.grid, runner.min_run_tokens)
    declared = {i["name"]: i["dtype"] for i in serving.spec["inputs"]}
    bounds = {name: (low, high) for name, low, high in value_bounds(serving.spec, runner.mask)}
    spec.inputs, spec.mask = len(runner.names), runner.names.index(runner.mask) if runner.mask else -1
    for i, (name, dtype) in enumerate(zip(runner.names, runner.dtypes)):
        spec.input_names[i].value = name.encode()
        spec.input_dtypes[i] = DATATYPES.index(declared[name])
        spec.input_bytes[i] = dtype.itemsize
        if name in bounds:
            spec.bounded[i], (spec.low[i], spec.high[i]) = 1, bounds[name]
    _cells(spec, runner)
    first = next(iter(runner.outputs.values()))
    spec.outputs = len(outputs)
    for o, ((name, datatype), tensor, tokens) in enumerate(zip(outputs, first, runner.per_token)):
        inner = tensor.shape[2:] if tokens else tensor.shape[1:]
        spec.output_names[o].value = name.encode()
        spec.output_dtypes[o], spec.per_token[o], spec.output_dims[o] = DATATYPES.index(datatype), tokens, len(inner)
        for d, size in enumerate(inner):
            spec.output_shapes[o][d] = size
        elements = 1
        for size in inner:
            elements *= size
        spec.output_unit_bytes[o] = elements * tensor.element_size()
    return spec


def _cells(spec: RaggedSpec, runner) -> None:
    """Every (length bucket, batch bucket) cell's graph and static buffers; -1 where the grid has none."""
    grid = runner.grid
    for k in range(MAX_LENGTHS):
        for j in range(MAX_BATCHES):
            spec.cell_of[k][j] = -1
    for c, (rows, length) in enumerate(sorted(runner.graphs)):
        spec.cell_of[grid.lengths.index(length)][grid.batches.index(rows)] = c
        spec.graphs[c] = runner.graphs[(rows, length)].raw_cuda_graph_exec()
        for i, tensor in enumerate(runner.static[(rows, length)]):
            spec.static_inputs[c][i] = tensor.data_ptr()
        for o, tensor in enumerate(runner.outputs[(rows, length)]):
            spec.static_outputs[c][o] = tensor.data_ptr()
    spec.cells = len(runner.graphs)


def open_ragged(handle: int, serving, device, outputs, library, wanted: bool = True) -> str | None:
    """Open the native path for a sequence model's instance; None when it serves from now on, else why not."""
    reason = ragged_why_not(serving, device, outputs, library, wanted)
    if reason is not None:
        return reason
    serving.stream.synchronize()
    spec = ragged_spec_for(serving, device, outputs)
    library.ipr_open.argtypes, library.ipr_open.restype = (ctypes.c_void_p, ctypes.POINTER(RaggedSpec)), ctypes.c_int
    code = library.ipr_open(handle, ctypes.byref(spec))
    return None if code == 0 else REASONS.get(code, f"ipr_open returned {code}")


RAGGED_COUNTS = ("batches", "requests", "rows", "real_tokens", "computed_tokens", "runs")
# where the native path's time went, ns summed over batches (ragged_path.c's timers, in its order)
RAGGED_TIMERS = (
    "native: read and check",
    "native: plan, stage and launch",
    "native: wait for a slot",
    "native: wait for the GPU",
    "native: answer",
    "native: statistics and release",
)


def ragged_counts(handle: int, library, close: bool = False) -> dict[str, int]:
    """What a sequence model's instance served natively (RAGGED_COUNTS) and the ns of each step (RAGGED_TIMERS);
    close: stop the path too."""
    names = RAGGED_COUNTS + RAGGED_TIMERS
    found = (c_uint64 * len(names))()
    function = library.ipr_close if close else library.ipr_counts
    function.argtypes, function.restype = (ctypes.c_void_p, ctypes.POINTER(c_uint64 * len(names))), None
    function(handle, ctypes.byref(found))
    return dict(zip(names, found))


def per_request_us(counted: dict[str, int]) -> str:
    """The note "; µs per request: read and check 4.1, ..." from ragged_counts, or "" before any request."""
    requests = counted.get("requests", 0)
    if not requests:
        return ""
    steps = [(name.removeprefix("native: "), counted.get(name, 0) / 1e3 / requests) for name in RAGGED_TIMERS]
    return "; µs per request: " + ", ".join(f"{name} {us:.1f}" for name, us in steps)
