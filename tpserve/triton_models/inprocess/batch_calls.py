"""Whole-batch calls into Triton's C API: read every request's inputs, answer every request, in one call each.

The in-process backend's ragged path spent tens of microseconds of Python per request on ctypes calls (inputs
located, response made, output written, sent, reported, released): about 5,000 single-sentence requests a
second. shim.c does those loops in C (ipb_input_shapes, ipb_gather, ipb_answer); this module binds
them (ctypes.PyDLL: the GIL stays held, each call takes microseconds) and shapes their arguments as numpy
arrays. A request these calls cannot handle (inputs not plain host tensors; outputs Triton places in device
memory) is handed back to Python, which does it the slow way.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from tpserve.triton_models.inprocess.triton_api import DATATYPES

LIBRARY = "libtriton_torch_inprocess.so"  # what server/triton/inprocess_build.py compiles the shim into
MAX_DIMS = 8  # inner dims an output may have (the shim's MAX_DIMS)
READ_OK, READ_BY_PYTHON = 0, 1
SENT, SENT_ERROR, DEFERRED = 0, 1, 2
ELEMENT_BYTES = np.array(
    [{"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2}.get(d, 0) for d in DATATYPES],
    np.int64,
)
ELEMENT_BYTES[[DATATYPES.index(d) for d in ("UINT32", "INT32", "FP32")]] = 4
ELEMENT_BYTES[[DATATYPES.index(d) for d in ("UINT64", "INT64", "FP64")]] = 8

_P = ctypes.c_void_p


@dataclass
class Inputs:
    """What ipb_input_shapes found: per request and input, the datatype (an index into DATATYPES) and
    [rows, width]; per request READ_OK or READ_BY_PYTHON."""

    dtypes: np.ndarray  # [requests, inputs] int32
    shapes: np.ndarray  # [requests, inputs, 2] int64
    status: np.ndarray  # [requests] uint8


@dataclass
class Answered:
    """What ipb_answer did per request (SENT, SENT_ERROR, DEFERRED), when it sent it, and, for a deferred one, its
    response and the device buffers (address 0: written already) of each output."""

    status: np.ndarray
    sent_at: np.ndarray  # monotonic ns
    responses: np.ndarray
    addresses: np.ndarray  # [requests, outputs]
    devices: np.ndarray


class BatchCalls:
    """The shim's batch calls, bound from the loaded library (a folder: Triton's backend artifacts)."""

    def __init__(self, folder: str):
        path = os.path.join(folder, LIBRARY)
        lib, free = ctypes.PyDLL(path), ctypes.CDLL(path)  # CDLL: the GIL is released for the call
        self._shapes = _bind(lib.ipb_input_shapes, [_P, ctypes.c_uint32, _P, ctypes.c_uint32, _P, _P, _P, _P])
        self._gather = _bind(
            free.ipb_gather, [_P, ctypes.c_uint32, _P, ctypes.c_uint32, _P, _P, _P, _P, ctypes.c_int64, _P]
        )
        self._answer = _bind(free.ipb_answer, [_P, ctypes.c_uint32, _P, _P, ctypes.c_uint32] + [_P] * 12)
        self._release = _bind(free.ipb_release, [_P, _P, ctypes.c_uint32, _P, _P, _P, _P])
        u64 = ctypes.c_uint64
        self.report = _bind(free.ipn_report, [_P, _P, ctypes.c_int, u64, u64, u64, u64, u64])  # + the histogram
        self._names: dict[tuple, tuple] = {}  # names -> (the C array, the encoded names it points at)
        self.native = free  # image_path.c's ipn_* (native_path.py binds them)

    def names(self, names: tuple[str, ...]):
        """A C array of the names (kept: the pointers must outlive every call)."""
        if names not in self._names:
            encoded = [n.encode() for n in names]
            self._names[names] = (ctypes.c_char_p * len(names))(*encoded), encoded
        return self._names[names][0]

    def input_shapes(self, requests: np.ndarray, names: tuple[str, ...]) -> Inputs:
        count, n = len(requests), len(names)
        found = Inputs(np.zeros((count, n), np.int32), np.zeros((count, n, 2), np.int64), np.zeros(count, np.uint8))
        self._shapes(
            _at(requests),
            count,
            self.names(names),
            n,
            _at(found.dtypes),
            _at(found.shapes),
            _at(found.status),
            _at(ELEMENT_BYTES),
        )
        return found

    def gather(self, requests, names, found: Inputs, first_row: np.ndarray, dest: list[np.ndarray]) -> None:
        """Copies the READ_OK requests' rows into dest (one [rows, widest] array per input, zero-filled)."""
        widest = dest[0].shape[1]
        pointers = np.array([a.ctypes.data for a in dest], np.uint64)
        items = np.array([a.itemsize for a in dest], np.int64)
        for array in dest:
            if not (array.ndim == 2 and array.flags.c_contiguous and array.shape[1] == widest):
                raise ValueError("gather needs C-contiguous [rows, widest] arrays")
        self._gather(
            _at(requests),
            len(requests),
            self.names(names),
            len(names),
            _at(found.status),
            _at(found.shapes),
            _at(first_row),
            _at(pointers),
            widest,
            _at(items),
        )

    def answer(self, requests, rows, first_row, outputs, spent: np.ndarray) -> "Answered":
        """Answers every request from outputs: (name, datatype, array [total rows, ...] C-contiguous) each, the
        requests' rows one after another from first_row. The requests stay held: release() them after. Adds the
        ns of each step to spent (uint64 [4]: outputs written, sent; release adds the other two)."""
        count, n = len(requests), len(outputs)
        names = self.names(tuple(name for name, _, _ in outputs))
        dtypes = np.array([DATATYPES.index(d) for _, d, _ in outputs], np.int32)
        arrays = [a for _, _, a in outputs]
        bases = np.array([a.ctypes.data for a in arrays], np.uint64)
        row_bytes = np.array([a[0].nbytes if len(a) else 0 for a in arrays], np.uint64)
        inner = np.zeros((n, MAX_DIMS), np.int64)
        for k, array in enumerate(arrays):
            if array.ndim - 1 > MAX_DIMS or not array.flags.c_contiguous:
                raise ValueError(f"output {outputs[k][0]}: answer needs C-contiguous arrays of at most {MAX_DIMS} dims")
            inner[k, : array.ndim - 1] = array.shape[1:]
        inner_dims = np.array([a.ndim - 1 for a in arrays], np.uint32)
        done = Answered(
            np.zeros(count, np.uint8),
            np.zeros(count, np.uint64),
            np.zeros(count, np.uint64),
            np.zeros((count, n), np.uint64),
            np.zeros((count, n), np.int64),
        )
        self._answer(
            _at(requests),
            count,
            _at(rows),
            _at(first_row),
            n,
            names,
            _at(dtypes),
            _at(bases),
            _at(row_bytes),
            _at(inner),
            _at(inner_dims),
            _at(done.status),
            _at(done.sent_at),
            _at(done.responses),
            _at(done.addresses),
            _at(done.devices),
            _at(spent),
        )
        return done

    def release(self, instance: int, requests: np.ndarray, done: "Answered", times, spent: np.ndarray) -> None:
        """Reports the answered requests' statistics (times: exec start, compute start, compute end; each ended
        when it was sent) and releases them. The GIL is released meanwhile."""
        stamps = np.asarray(times, np.uint64)  # every array passed by address stays referenced through the call
        self._release(
            instance, _at(requests), len(requests), _at(done.status), _at(stamps), _at(done.sent_at), _at(spent)
        )


def load(folder: str) -> BatchCalls | None:
    """The batch calls of the library in folder, or None where it lacks them (Python does the work)."""
    try:
        return BatchCalls(folder)
    except (OSError, AttributeError):
        return None


def _bind(function, argtypes):
    function.argtypes, function.restype = argtypes, None
    return function


def _at(array: np.ndarray) -> int:
    return array.ctypes.data
