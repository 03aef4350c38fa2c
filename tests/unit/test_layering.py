"""The layers, bottom to top; a module imports only from its own layer and the layers below it:

    common         errors, CLI helpers and options, endpoint and server-state records: imports no project package
    triton_models  code that runs inside tritonserver (copied into repositories): imports no project package
    builders       specs, export, checks, engines, repository writing
    server         launching, supervising, the edge and the cluster
    clients        requests to any Triton: inference, model plans, answer checks
    operations     what needs both the server's files and its API: rollouts
    loadtest       measurement: perf_analyzer, Locust, soak, gpu/text benches, reports
    benchmarks     the project's own instruments: not packaged; imports the product, never imported by it

No exemption: a command line lives in the layer of the work it does. And no two modules import each other,
directly or around a circle."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "tpserve"  # the one import package the wheel installs; its parts are the layers
LAYERS = ("common", "builders", "server", "clients", "operations", "loadtest", "benchmarks")
PRODUCT = ("common", "triton_models", *LAYERS[1:-1])  # what the wheel installs
# package -> project packages it must never import (at module level or inside functions)
FORBIDDEN = {layer: set(LAYERS[i + 1 :]) for i, layer in enumerate(LAYERS)}
FORBIDDEN["common"].add("triton_models")
FORBIDDEN["triton_models"] = set(LAYERS)


def _folder(part: str) -> Path:
    return ROOT / part if part == "benchmarks" else PACKAGE / part


def _part(name: str) -> str:
    """The layer an imported module belongs to: tpserve.server.x -> server (benchmarks.x -> benchmarks)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "tpserve" and len(parts) > 1 else parts[0]


def _imported_modules(path: Path) -> set[str]:
    """Full names of what a module imports (for `from a.b import c`: a.b and a.b.c)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _modules() -> dict[str, Path]:
    found = {}
    for package in FORBIDDEN:
        for path in _folder(package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


@pytest.mark.parametrize("package", sorted(p for p in FORBIDDEN if FORBIDDEN[p]))  # benchmarks: top
def test_a_layer_never_imports_the_layers_above_it(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted({_part(n) for n in _imported_modules(path)} & FORBIDDEN[package])
        for path in _folder(package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_imports_itself_around_a_circle():
    modules = _modules()
    graph = {name: {m for m in _imported_modules(path) if m in modules and m != name} for name, path in modules.items()}
    circles = []
    for start in graph:  # a depth-first walk from every module; small graph, fine
        stack, seen = [(start, (start,))], set()
        while stack:
            name, trail = stack.pop()
            for nxt in graph[name]:
                if nxt == start:
                    circles.append(trail)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + (nxt,)))
    assert sorted({tuple(sorted(c)) for c in circles}) == []


def test_the_product_never_imports_the_instruments():
    """benchmarks/ is not installed: a product module importing it would work in a checkout and fail for users."""
    offenders = {
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in _folder(package).rglob("*.py")
        if any(name.split(".")[0] == "benchmarks" for name in _imported_modules(path))
    }
    assert offenders == set()


def test_the_wheel_holds_the_product_and_no_instrument(tmp_path):
    """The wheel pyproject builds (what `make bundle` ships) holds one top-level package, tpserve, with every part
    of the product in it, and nothing of benchmarks/."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"  # a copy: setuptools writes build/ beside pyproject.toml
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("tpserve", "benchmarks"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source)]
    subprocess.run([*command, "-w", str(tmp_path)], check=True, capture_output=True, cwd=tmp_path, timeout=300)
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"tpserve"} and {n.split("/")[1] for n in names if n.count("/") > 1} >= set(PRODUCT)
    assert "tpserve/loadtest/benches/soak.py" in names and "tpserve/server/triton/front/wrappers.c" in names
    native = [p.relative_to(ROOT).as_posix() for p in (ROOT / "tpserve").rglob("*") if p.suffix in (".c", ".h", ".lua")]
    assert sorted(set(native) - set(names)) == []  # what is compiled where it serves travels with the wheel
    assert not [name for name in names if "record_bench" in name or "reconcile" in name]
