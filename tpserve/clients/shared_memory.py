"""Inference through CUDA shared memory: inputs and outputs stay in GPU memory the client owns."""

from __future__ import annotations

import uuid

import numpy as np

from tpserve.clients.connection import refused_as_client_error
from tpserve.common.endpoints import Endpoint


def infer_cuda_shm(ep: Endpoint, model: str, arrays: dict, outputs: dict, device_id: int = 0) -> dict:
    """Run one request with every input and output in a registered CUDA shared-memory region.

    Args:
        arrays: input name -> numpy array (copied once into GPU memory).
        outputs: output name -> (numpy dtype, shape) expected back.

    Returns:
        Output name -> numpy array (read back from GPU memory after the request).
    """
    import tritonclient.utils.cuda_shared_memory as cudashm

    tag = uuid.uuid4().hex[:8]
    regions: list = []
    with ep.client() as client, refused_as_client_error(f"{model} (CUDA shared memory)"):
        try:
            inputs = [_input(ep, client, cudashm, tag, regions, n, a, device_id) for n, a in arrays.items()]
            requested = [_output(ep, client, cudashm, tag, regions, n, spec, device_id) for n, spec in outputs.items()]
            client.infer(model, inputs, outputs=requested)
            return {
                name: cudashm.get_contents_as_numpy(handle, np.dtype(dtype), shape)
                for (name, (dtype, shape)), handle in zip(outputs.items(), regions[len(arrays) :])
            }
        finally:
            for handle in regions:
                cudashm.destroy_shared_memory_region(handle)
            client.unregister_cuda_shared_memory(headers=ep.admin_headers)


def _register(ep, client, cudashm, region, nbytes, device_id):
    handle = cudashm.create_shared_memory_region(region, nbytes, device_id)
    client.register_cuda_shared_memory(
        region, cudashm.get_raw_handle(handle), device_id, nbytes, headers=ep.admin_headers
    )
    return handle


def _input(ep, client, cudashm, tag, regions, name, array, device_id):
    from tritonclient.utils import np_to_triton_dtype

    handle = _register(ep, client, cudashm, f"in_{name}_{tag}", array.nbytes, device_id)
    regions.append(handle)
    cudashm.set_shared_memory_region(handle, [np.ascontiguousarray(array)])
    tensor = ep.module().InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_shared_memory(f"in_{name}_{tag}", array.nbytes)
    return tensor


def _output(ep, client, cudashm, tag, regions, name, spec, device_id):
    dtype, shape = spec
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    regions.append(_register(ep, client, cudashm, f"out_{name}_{tag}", nbytes, device_id))
    tensor = ep.module().InferRequestedOutput(name)
    tensor.set_shared_memory(f"out_{name}_{tag}", nbytes)
    return tensor
