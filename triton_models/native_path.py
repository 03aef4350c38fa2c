"""The in-process backend's native per-batch path (inprocess_native.c), opened for one instance at load.

Python builds the engine, captures its CUDA graphs and knows their buffers; this module hands the native side
what it needs to serve every later batch alone: each bucket's graph executable (torch's
`CUDAGraph.raw_cuda_graph_exec()`), the device addresses of its static input and outputs, the instance's
stream, and the input's and outputs' names, datatypes and shapes. From then on Triton's execute for that
instance runs no Python, inputs in GPU memory (CUDA shared memory) included.

Which models take it: a staged runner on a GPU (one fixed-shape input, a graph for every bucket, contiguous
outputs): the image engines. Sequence models (batching across lengths) and the tokenize step stay on the
Python path; `why_not` says why, and the instance's load says which path it took.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char, c_int32, c_int64, c_uint32, c_uint64

from triton_models.triton_api import DATATYPES

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
    from triton_models.torch_serving import TORCH_DTYPES

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
