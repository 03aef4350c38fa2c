"""The import graph of the product, package by package, drawn to docs/layers.png: what the installed wheel is
made of, bottom layer first, and how many imports run from each package to each one below it. benchmarks/ is
drawn apart, above the product (it imports the product; nothing of the product imports it).

    .venv/bin/python -m benchmarks.import_graph            # writes docs/layers.png
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (  # bottom to top; packages side by side on one layer do not import each other
    ("common", "triton_models"),
    ("builders",),
    ("server", "clients"),
    ("operations", "loadtest"),
)
INSTRUMENTS = "benchmarks"
ROLES = {
    "common": "errors, CLI helpers, records",
    "triton_models": "runs inside tritonserver",
    "builders": "export, validate, write repositories",
    "server": "launch, supervise, edge, cluster",
    "clients": "requests to any Triton",
    "operations": "rollouts",
    "loadtest": "perf, Locust, reports, soak",
    INSTRUMENTS: "our own instruments (not installed)",
}


def imports(package: str) -> Counter:
    """Per project package, how many import statements of `package` name it (functions' own imports too)."""
    names = {p for layer in LAYERS for p in layer} | {INSTRUMENTS}
    found: Counter = Counter()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            for module in modules:
                top = module.split(".")[0]
                if top in names and top != package:
                    found[top] += 1
    return found


def lines(package: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in (ROOT / package).rglob("*.py"))


def draw(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    places: dict[str, tuple[float, float]] = {}
    rows = [*LAYERS, (INSTRUMENTS,)]
    for row, layer in enumerate(rows):
        for column, package in enumerate(layer):
            places[package] = ((column + 0.5) * 10 / len(layer), row * 2.2)
    fig, ax = plt.subplots(figsize=(10, 7.5))
    for package, (x, y) in places.items():
        apart = package == INSTRUMENTS
        box = dict(boxstyle="round,pad=0.5", fc="#f3f3f3" if apart else "#dce9f5", ec="#888", ls="--" if apart else "-")
        text = f"{package}/\n{ROLES[package]}\n{lines(package):,} lines of Python"
        ax.text(x, y, text, ha="center", va="center", fontsize=9, bbox=box, zorder=3)
    for source in places:
        for target, count in imports(source).items():
            (x0, y0), (x1, y1) = places[source], places[target]
            style = dict(arrowstyle="->", color="#999" if source == INSTRUMENTS else "#345", lw=0.6 + 0.04 * count)
            ax.annotate("", xy=(x1, y1 + 0.45), xytext=(x0, y0 - 0.45), arrowprops=style, zorder=1)
            at = (x0 + 0.25 * (x1 - x0), y0 - 0.45 + 0.25 * (y1 - y0 + 0.9))  # a quarter of the way down
            ax.text(*at, str(count), fontsize=7, color="#555", zorder=2, bbox=dict(fc="white", ec="none", pad=0.5))
    ax.set_xlim(-0.5, 10.5)
    ax.set_ylim(-1, len(rows) * 2.2 - 1)
    ax.axis("off")
    ax.set_title("The installed product (blue) and our instruments: arrow = imports, number = import statements")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "layers.png"))
