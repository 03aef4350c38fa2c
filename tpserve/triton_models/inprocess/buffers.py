"""Triton's request buffers as numpy arrays and torch tensors, by address (host or device memory): what the
in-process backend's paths read requests through and write answers with."""

from __future__ import annotations

import ctypes

from tpserve.triton_models.inprocess.triton_api import ERROR_INVALID_ARG, MEMORY_GPU


class BackendError(Exception):
    def __init__(self, message: str, code: int = ERROR_INVALID_ARG):
        super().__init__(message)
        self.code = code


def as_tensor(view, device):
    """A request input as a torch tensor: a zero-copy view of Triton's buffer (host or GPU), or, for an input
    Triton holds in several buffers, one host copy of them."""
    import torch

    from tpserve.triton_models.runtime.torch_serving import TORCH_DTYPES

    dtype = TORCH_DTYPES.get(f"TYPE_{view.datatype}")
    if dtype is None:
        raise BackendError(f"input {view.name}: datatype {view.datatype} is not served by the torch runtime")
    chunks = [device_bytes(address, size, memory, device_id) for address, size, memory, device_id in view.chunks]
    flat = chunks[0] if len(chunks) == 1 else torch.cat([c.cpu() for c in chunks])
    if flat.numel() != view.nbytes:
        raise BackendError(
            f"input {view.name}: {flat.numel()} bytes arrived, its shape {list(view.shape)} needs {view.nbytes}"
        )
    return flat.view(dtype).reshape(view.shape)


def as_array(view):
    """A request input as a numpy array: a view of Triton's host buffer (one chunk), or one copy of several;
    device memory is copied to the host."""
    import numpy as np

    from tpserve.triton_models.runtime.torch_serving import NUMPY_DTYPES

    dtype = NUMPY_DTYPES.get(view.datatype)
    if dtype is None:
        raise BackendError(f"input {view.name}: datatype {view.datatype} is not served here")
    if any(memory == MEMORY_GPU for _, _, memory, _ in view.chunks):
        return as_tensor(view, "cpu").cpu().numpy()
    parts = [
        np.frombuffer((ctypes.c_char * size).from_address(address), np.uint8)
        for address, size, _, _ in view.chunks
        if size
    ]
    flat = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, np.uint8)
    if flat.nbytes != view.nbytes:
        raise BackendError(
            f"input {view.name}: {flat.nbytes} bytes arrived, its shape {list(view.shape)} needs {view.nbytes}"
        )
    return flat.view(dtype).reshape(view.shape)


def device_bytes(address: int, size: int, memory: int, device_id: int):
    import torch

    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    if memory == MEMORY_GPU:
        return torch.as_tensor(_CudaBytes(address, size), device=f"cuda:{device_id}")
    return torch.frombuffer((ctypes.c_char * size).from_address(address), dtype=torch.uint8)


class _CudaBytes:
    """Device memory at an address, as __cuda_array_interface__ (torch wraps it without a copy)."""

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False), "version": 3}


class HostRows:
    """Rows of a host output buffer, by address: what a staged batch hands to each of its requests."""

    __slots__ = ("address", "shape", "nbytes")

    def __init__(self, address: int, shape: tuple, nbytes: int):
        self.address, self.shape, self.nbytes = address, shape, nbytes
