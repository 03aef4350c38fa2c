"""Numeric tensors into and out of the Python-backend stub under numpy 2, through DLPack and torch.

The embedded tritonserver's stub was built against numpy 1. Under numpy 2 (2.5.2 on a GPU host) the arrays it made
for a model's outputs reached clients empty, while torch tensors handed over through DLPack arrived whole (the torch
runtime's path). So under numpy 2 numeric tensors cross as torch tensors through DLPack; under numpy 1 they keep
the stub's own numpy (no torch import in the stub: the server image has none). numpy's own DLPack capsules are not
used: the stub renames a capsule as torch does, and numpy's capsule destructor then fails on the name. BYTES and BOOL
keep the stub's numpy, which needs numpy 1 (server.triton.launcher.numpy_problem refuses them under numpy 2).

Imported by model.py files the repository writer copies; keep it free of heavy imports.
"""

import numpy as np

NUMPY_2 = int(np.__version__.split(".")[0]) >= 2  # read at each call: a test takes the DLPack path under numpy 1


def through_dlpack(config_type: str) -> bool:
    """Whether a tensor of this config data type (TYPE_FP32, ...) may cross through DLPack: numbers, not BYTES or
    BOOL."""
    return config_type not in ("TYPE_STRING", "TYPE_BOOL")


def input_array(pb_utils, request, name: str, dlpack: bool = True) -> np.ndarray:
    """A request's input as a numpy array: under numpy 2 a number in host memory through DLPack (dlpack, from the
    config's data type: through_dlpack), else the stub's own reading."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"input {name!r} is missing")
    if NUMPY_2 and dlpack and tensor.is_cpu():
        import torch.utils.dlpack

        return torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).numpy()
    return tensor.as_numpy()


def output_tensor(pb_utils, name: str, array):
    """A pb_utils.Tensor of a numpy array: under numpy 2 a number through DLPack, else the stub's own numpy."""
    array = np.asarray(array)
    if NUMPY_2 and array.dtype.kind in "iuf":
        import torch
        import torch.utils.dlpack

        array = np.require(array, requirements=["C", "W"])  # torch takes neither readonly arrays nor odd strides
        return pb_utils.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(torch.from_numpy(array)))
    return pb_utils.Tensor(name, np.ascontiguousarray(array))
