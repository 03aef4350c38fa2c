"""The part of Triton's C API (tritonserver.h, tritonbackend.h, backend API 1.x) the in-process backend calls.

Bound with ctypes to the symbols of the tritonserver process the backend runs in (libtritonserver is loaded
there already). Every call that returns a TRITONSERVER_Error* is checked: a non-null error is raised as
TritonCallError with Triton's message, and deleted. Pointers travel as Python ints.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_bool, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p

# TRITONSERVER_DataType, in the header's order
DATATYPES = (
    "INVALID",
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
    "BF16",
)
MEMORY_CPU, MEMORY_CPU_PINNED, MEMORY_GPU = 0, 1, 2
KIND_AUTO, KIND_CPU, KIND_GPU, KIND_MODEL = 0, 1, 2, 3
ERROR_UNKNOWN, ERROR_INTERNAL, ERROR_NOT_FOUND, ERROR_INVALID_ARG, ERROR_UNAVAILABLE, ERROR_UNSUPPORTED = range(6)
REQUEST_RELEASE_ALL = 1
RESPONSE_COMPLETE_FINAL = 1
API_MAJOR = 1

_P = c_void_p
_SIGNATURES = {  # name: argument types; every one of these returns TRITONSERVER_Error*
    "TRITONBACKEND_ApiVersion": (POINTER(c_uint32), POINTER(c_uint32)),
    "TRITONBACKEND_BackendArtifacts": (_P, POINTER(c_int), POINTER(c_char_p)),
    "TRITONBACKEND_ModelName": (_P, POINTER(c_char_p)),
    "TRITONBACKEND_ModelVersion": (_P, POINTER(c_uint64)),
    "TRITONBACKEND_ModelRepository": (_P, POINTER(c_int), POINTER(c_char_p)),
    "TRITONBACKEND_ModelConfig": (_P, c_uint32, POINTER(_P)),
    "TRITONSERVER_MessageSerializeToJson": (_P, POINTER(_P), POINTER(c_size_t)),
    "TRITONSERVER_MessageDelete": (_P,),
    "TRITONBACKEND_ModelInstanceModel": (_P, POINTER(_P)),
    "TRITONBACKEND_ModelInstanceName": (_P, POINTER(c_char_p)),
    "TRITONBACKEND_ModelInstanceKind": (_P, POINTER(c_int)),
    "TRITONBACKEND_ModelInstanceDeviceId": (_P, POINTER(c_int32)),
    "TRITONBACKEND_RequestInput": (_P, c_char_p, POINTER(_P)),
    "TRITONBACKEND_InputProperties": (
        _P,
        POINTER(c_char_p),
        POINTER(c_int),
        POINTER(POINTER(c_int64)),
        POINTER(c_uint32),
        POINTER(c_uint64),
        POINTER(c_uint32),
    ),
    "TRITONBACKEND_InputBuffer": (_P, c_uint32, POINTER(_P), POINTER(c_uint64), POINTER(c_int), POINTER(c_int64)),
    "TRITONBACKEND_RequestOutputCount": (_P, POINTER(c_uint32)),
    "TRITONBACKEND_RequestOutputName": (_P, c_uint32, POINTER(c_char_p)),
    "TRITONBACKEND_ResponseNew": (POINTER(_P), _P),
    "TRITONBACKEND_ResponseOutput": (_P, POINTER(_P), c_char_p, c_int, POINTER(c_int64), c_uint32),
    "TRITONBACKEND_OutputBuffer": (_P, POINTER(_P), c_uint64, POINTER(c_int), POINTER(c_int64)),
    "TRITONBACKEND_ResponseSend": (_P, c_uint32, _P),
    "TRITONBACKEND_RequestRelease": (_P, c_uint32),
    "TRITONBACKEND_ModelInstanceReportStatistics": (_P, _P, c_bool, c_uint64, c_uint64, c_uint64, c_uint64),
    "TRITONBACKEND_ModelInstanceReportBatchStatistics": (_P, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64),
}


class TritonCallError(RuntimeError):
    """A Triton API call returned an error (its message is Triton's)."""


class TritonApi:
    """Checked calls into the running tritonserver's C API; `lib` defaults to the process's own symbols.

    The calls keep the GIL (ctypes.PyDLL): each takes microseconds and never waits on a thread that runs
    Python, while releasing and taking the GIL back around every one of them let another instance's thread
    in, and taking it back then waited for that thread's switch interval (measured: 160-320 µs per request
    read or answered with two ragged instances, against tens of µs alone).
    """

    def __init__(self, lib=None):
        lib = lib if lib is not None else ctypes.PyDLL(None)
        self._error_new = _bind(lib, "TRITONSERVER_ErrorNew", (c_int, c_char_p), _P)
        self._error_message = _bind(lib, "TRITONSERVER_ErrorMessage", (_P,), c_char_p)
        self._error_delete = _bind(lib, "TRITONSERVER_ErrorDelete", (_P,), None)
        self._calls = {name: _bind(lib, name, args, _P) for name, args in _SIGNATURES.items()}

    def error(self, code: int, message: str) -> int:
        """A new TRITONSERVER_Error (its address): what an entry point returns, or a response carries."""
        return self._error_new(code, message.encode("utf-8", "replace")) or 0

    def call(self, name: str, *args) -> None:
        err = self._calls[name](*args)
        if err:
            message = (self._error_message(err) or b"").decode("utf-8", "replace")
            self._error_delete(err)
            raise TritonCallError(f"{name}: {message}")

    # the calls with outputs, as values
    def api_version(self) -> tuple[int, int]:
        major, minor = c_uint32(), c_uint32()
        self.call("TRITONBACKEND_ApiVersion", byref(major), byref(minor))
        return major.value, minor.value

    def string(self, name: str, handle: int) -> str:
        value = c_char_p()
        self.call(name, handle, byref(value))
        return (value.value or b"").decode()

    def model_version(self, model: int) -> int:
        value = c_uint64()
        self.call("TRITONBACKEND_ModelVersion", model, byref(value))
        return value.value

    def backend_folder(self, backend: int) -> str:
        """Where the backend's library lies (its artifacts folder)."""
        kind, location = c_int(), c_char_p()
        self.call("TRITONBACKEND_BackendArtifacts", backend, byref(kind), byref(location))
        return (location.value or b"").decode()

    def model_repository(self, model: int) -> str:
        kind, location = c_int(), c_char_p()
        self.call("TRITONBACKEND_ModelRepository", model, byref(kind), byref(location))
        return (location.value or b"").decode()

    def model_config_json(self, model: int) -> str:
        message, base, size = c_void_p(), c_void_p(), c_size_t()
        self.call("TRITONBACKEND_ModelConfig", model, 1, byref(message))
        try:
            self.call("TRITONSERVER_MessageSerializeToJson", message, byref(base), byref(size))
            return ctypes.string_at(base, size.value).decode()
        finally:
            self.call("TRITONSERVER_MessageDelete", message)

    def instance_model(self, instance: int) -> int:
        model = c_void_p()
        self.call("TRITONBACKEND_ModelInstanceModel", instance, byref(model))
        return model.value or 0

    def instance_placement(self, instance: int) -> tuple[int, int]:
        kind, device = c_int(), c_int32()
        self.call("TRITONBACKEND_ModelInstanceKind", instance, byref(kind))
        self.call("TRITONBACKEND_ModelInstanceDeviceId", instance, byref(device))
        return kind.value, device.value

    def input(self, request: int, name: str) -> "InputView":
        handle, pname, dtype = c_void_p(), c_char_p(), c_int()
        shape, dims, size, buffers = POINTER(c_int64)(), c_uint32(), c_uint64(), c_uint32()
        self.call("TRITONBACKEND_RequestInput", request, name.encode(), byref(handle))
        self.call(
            "TRITONBACKEND_InputProperties",
            handle,
            byref(pname),
            byref(dtype),
            byref(shape),
            byref(dims),
            byref(size),
            byref(buffers),
        )
        dims_list = tuple(shape[i] for i in range(dims.value))
        chunks = [self._input_buffer(handle, i) for i in range(buffers.value)]
        return InputView(name, DATATYPES[dtype.value], dims_list, size.value, chunks)

    def _input_buffer(self, handle, index: int) -> tuple[int, int, int, int]:
        buffer, size, memory, device = c_void_p(), c_uint64(), c_int(MEMORY_CPU), c_int64(0)
        self.call("TRITONBACKEND_InputBuffer", handle, index, byref(buffer), byref(size), byref(memory), byref(device))
        return buffer.value or 0, size.value, memory.value, device.value

    def requested_outputs(self, request: int) -> list[str]:
        count = c_uint32()
        self.call("TRITONBACKEND_RequestOutputCount", request, byref(count))
        names = []
        for index in range(count.value):
            name = c_char_p()
            self.call("TRITONBACKEND_RequestOutputName", request, index, byref(name))
            names.append((name.value or b"").decode())
        return names

    def response_new(self, request: int) -> int:
        response = c_void_p()
        self.call("TRITONBACKEND_ResponseNew", byref(response), request)
        return response.value or 0

    def output_buffer(self, response: int, name: str, datatype: str, shape: tuple, nbytes: int, gpu: bool):
        """Room for one output in the response: (address, memory type, device id)."""
        output, dims = c_void_p(), (c_int64 * len(shape))(*shape)
        self.call(
            "TRITONBACKEND_ResponseOutput", response, byref(output), name.encode(), _dtype(datatype), dims, len(shape)
        )
        buffer, memory, device = c_void_p(), c_int(MEMORY_GPU if gpu else MEMORY_CPU), c_int64(0)
        self.call("TRITONBACKEND_OutputBuffer", output, byref(buffer), nbytes, byref(memory), byref(device))
        return buffer.value or 0, memory.value, device.value

    def send(self, response: int, error: int = 0) -> None:
        self.call("TRITONBACKEND_ResponseSend", response, RESPONSE_COMPLETE_FINAL, error or None)

    def release(self, request: int) -> None:
        self.call("TRITONBACKEND_RequestRelease", request, REQUEST_RELEASE_ALL)

    def report(self, instance: int, request: int, ok: bool, times: tuple[int, int, int, int]) -> None:
        self.call("TRITONBACKEND_ModelInstanceReportStatistics", instance, request, ok, *times)

    def report_batch(self, instance: int, batch: int, times: tuple[int, int, int, int]) -> None:
        self.call("TRITONBACKEND_ModelInstanceReportBatchStatistics", instance, batch, *times)


class InputView:
    """One input of a request as Triton holds it: name, datatype, shape, and its buffers
    (address, bytes, memory type, device id); nothing is copied."""

    __slots__ = ("name", "datatype", "shape", "nbytes", "chunks")

    def __init__(self, name, datatype, shape, nbytes, chunks):
        self.name, self.datatype, self.shape, self.nbytes, self.chunks = name, datatype, shape, nbytes, chunks


def _dtype(name: str) -> int:
    return DATATYPES.index(name)


def _bind(lib, name: str, argtypes, restype):
    function = getattr(lib, name)
    function.argtypes, function.restype = argtypes, restype
    return function
