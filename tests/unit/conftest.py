"""The unit tier (`make test-unit`): no server, and no full training run.

`digits_build` here shadows the session fixture of tests/conftest.py with a tiny digits_cnn: the same
network trained for 3 epochs (about 3 s instead of 17 s), enough for export, validation, INT8 and
repository tests. The full model's accuracy is checked in tests/functional/.
"""

import dataclasses

import pytest

TINY_EPOCHS = 3


@pytest.fixture(scope="session")
def digits_build(tmp_path_factory):
    """A tiny digits_cnn for the session: spec, BuiltModel, exported and validated ONNX."""
    from tpserve.builders.checks import validate
    from tpserve.builders.formats import export
    from tpserve.builders.spec import zoo

    spec = zoo.get_spec("digits_cnn", max_batch_size=16)
    spec = dataclasses.replace(spec, builder_args={**spec.builder_args, "epochs": TINY_EPOCHS})
    built = zoo.build_module(spec)
    out_dir = tmp_path_factory.mktemp("digits_tiny") / spec.name
    result = export.export_onnx(built.module, spec, out_dir, "session-hash", built.metrics)
    validate.validate(built.module, result.path, spec, sample_data=built.sample_data)
    return spec, built, result


@pytest.fixture(scope="module")
def shim():
    """The shim's library (server/triton/triton_shim.c and front/*.c), built as `make install` builds it."""
    from tpserve.server.triton.preloads import build_library

    try:
        return build_library()
    except Exception as err:  # no C compiler on this host
        pytest.skip(f"the shim cannot be built here: {err}")


@pytest.fixture(scope="session")
def c_library(tmp_path_factory):
    """A function compiling one of the backend's C files alone into a library (warnings as errors), loaded; the
    test skips, saying why, where there is no C compiler (the in-process backend is built where it serves)."""
    import ctypes
    import subprocess

    from tpserve.common.native_build import c_compiler

    def build(source, name: str) -> ctypes.CDLL:
        compiler = c_compiler()
        if compiler is None:
            pytest.skip("no C compiler (cc/gcc): the in-process backend is built where it serves")
        target = tmp_path_factory.mktemp(name) / f"{name}.so"
        command = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(target), str(source)]
        subprocess.run(command, check=True)
        return ctypes.CDLL(str(target))

    return build
