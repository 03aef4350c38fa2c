"""The dependency direction is one way: spec/artifacts (builders) -> code inside tritonserver
(triton_models) -> server -> clients -> measurement (loadtest)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# package -> project packages it must never import (at module level or inside functions)
FORBIDDEN = {
    "builders": {"clients", "loadtest", "server"},
    "triton_models": {"builders", "clients", "loadtest", "server"},
    "server": {"clients", "loadtest"},
    "clients": {"loadtest"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


# Command lines are composition roots: `python -m server rollout` offers, where users look for
# server operations, a command whose work is a client's (clients/rollout.py).
CLI_MAY_IMPORT = {"server/__main__.py": {"clients"}}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_never_imports_the_layers_above_it(package):
    offenders = {
        name: sorted(_imports(path) & FORBIDDEN[package] - CLI_MAY_IMPORT.get(name, set()))
        for path in (ROOT / package).rglob("*.py")
        for name in [str(path.relative_to(ROOT))]
    }
    assert {k: v for k, v in offenders.items() if v} == {}
