"""Fixtures shared by unit and functional tests."""

import os

import pytest

os.environ.setdefault("TPSERVE_NATIVE_WERROR", "1")  # whatever C the tests build: every warning an error


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds right now."""
    from tpserve.common.endpoints import free_ports

    return free_ports(1)[0]


@pytest.fixture(scope="session")
def digits_build(tmp_path_factory):
    """digits_cnn trained once for the session: spec, BuiltModel, exported and validated ONNX."""
    from tpserve.builders.checks import validate
    from tpserve.builders.formats import export
    from tpserve.builders.spec import zoo

    spec = zoo.get_spec("digits_cnn", max_batch_size=16)
    built = zoo.build_module(spec)
    out_dir = tmp_path_factory.mktemp("digits_work") / spec.name
    result = export.export_onnx(built.module, spec, out_dir, "session-hash", built.metrics)
    validate.validate(built.module, result.path, spec, sample_data=built.sample_data)
    return spec, built, result
