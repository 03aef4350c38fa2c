"""Three CUDA driver calls (libcuda, through ctypes) for the in-process backend's shortest path.

Inside tritonserver each torch op on the request path costs several times what it costs in a plain Python
process (a lone batch-1 request: host-to-device copy 161 µs through torch.Tensor.copy_, measured on the H100
host; docs/gpu/request_profile_h100_inprocess.md). The copies of a lone small batch and the event that ends it
are plain asynchronous driver calls on the instance's stream instead; everything else stays torch's.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, c_int, c_size_t, c_void_p

_LIB = None


def _lib():
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL("libcuda.so.1")
        for name, args in (
            ("cuMemcpyHtoDAsync_v2", (c_void_p, c_void_p, c_size_t, c_void_p)),
            ("cuMemcpyDtoHAsync_v2", (c_void_p, c_void_p, c_size_t, c_void_p)),
            ("cuEventRecord", (c_void_p, c_void_p)),
            ("cuDeviceGet", (POINTER(c_int), c_int)),
            ("cuDevicePrimaryCtxRetain", (POINTER(c_void_p), c_int)),
            ("cuCtxSetCurrent", (c_void_p,)),
        ):
            getattr(lib, name).argtypes, getattr(lib, name).restype = args, c_int
        _LIB = lib
    return _LIB


def available() -> bool:
    try:
        _lib()
        return True
    except OSError:
        return False


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"CUDA driver {what} failed (CUresult {result})")


def host_to_device(device: int, host: int, nbytes: int, stream: int) -> None:
    _check(_lib().cuMemcpyHtoDAsync_v2(device, host, nbytes, stream), "host-to-device copy")


def device_to_host(host: int, device: int, nbytes: int, stream: int) -> None:
    _check(_lib().cuMemcpyDtoHAsync_v2(host, device, nbytes, stream), "device-to-host copy")


def record(event: int, stream: int) -> None:
    _check(_lib().cuEventRecord(event, stream), "event record")


_CURRENT = threading.local()


def ensure_context(ordinal: int) -> None:
    """Make the device's primary context (the one torch and Triton use) current on this thread, once."""
    if getattr(_CURRENT, "ordinal", None) == ordinal:
        return
    lib = _lib()
    device, context = c_int(), c_void_p()
    _check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
    _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    _check(lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    _CURRENT.ordinal = ordinal
