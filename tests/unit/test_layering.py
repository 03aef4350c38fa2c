"""The layers, bottom to top; a module imports only from its own layer and the layers below it:

    common         errors, CLI helpers and options, endpoint and server-state records: imports no project package
    triton_models  code that runs inside tritonserver (copied into repositories): imports no project package
    builders       specs, export, checks, engines, repository writing
    server         launching, supervising, the edge and the cluster
    clients        requests to any Triton: inference, model plans, answer checks
    operations     what needs both the server's files and its API: rollouts
    loadtest       measurement: perf_analyzer, Locust, benchmarks, reports

No exemption: a command line lives in the layer of the work it does. And no two modules import each other,
directly or around a circle."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
LAYERS = ("common", "builders", "server", "clients", "operations", "loadtest")
# package -> project packages it must never import (at module level or inside functions)
FORBIDDEN = {layer: set(LAYERS[i + 1 :]) for i, layer in enumerate(LAYERS)}
FORBIDDEN["common"].add("triton_models")
FORBIDDEN["triton_models"] = set(LAYERS)


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
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


@pytest.mark.parametrize("package", sorted(p for p in FORBIDDEN if FORBIDDEN[p]))  # loadtest: top
def test_a_layer_never_imports_the_layers_above_it(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted({n.split(".")[0] for n in _imported_modules(path)} & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
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
