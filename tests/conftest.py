"""Fixtures shared by unit and functional tests."""

import os

import pytest

os.environ.setdefault("TPSERVE_NATIVE_WERROR", "1")  # whatever C the tests build: every warning an error

# a full run's temporary folders peaked at 1.9 GiB (2-core host); servers' logs under the checkout come on top
ROOM_GIB = 3


def pytest_sessionstart(session):
    """Stop before the first test where the disk is nearly full: there every test that builds or serves would
    error on its own, and the run would end in a hundred errors instead of this one line."""
    import shutil
    import tempfile
    from pathlib import Path

    for what, where in (("the temporary folder", tempfile.gettempdir()), ("the checkout", Path(__file__).parent)):
        free = shutil.disk_usage(where).free / 2**30
        if free < ROOM_GIB:
            pytest.exit(
                f"{what} ({where}) has {free:.1f} GiB free; the tests need {ROOM_GIB} GiB: free some room (old "
                "clones, /tmp/pytest-of-*), or point TMPDIR at a roomier disk",
                returncode=2,
            )


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
