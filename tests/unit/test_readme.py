"""The documentation's commands exist (the README and the guides it links in docs/): every `make <target>` is a
Makefile target, every `python -m <package> <command>` a command of that package's CLI."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
GUIDES = tuple(sorted(p.stem for p in (ROOT / "docs").glob("*.md") if p.stem != "index"))
DOCS = README + "".join((ROOT / "docs" / f"{name}.md").read_text() for name in GUIDES)
TARGETS = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
PACKAGES = "builders|server|clients|operations|loadtest|benchmarks"
COMMANDS = sorted(set(re.findall(rf"python -m ({PACKAGES}) ([a-z][a-z-]*)", DOCS)))


@pytest.mark.parametrize("target", sorted(set(re.findall(r"(?<!--entrypoint )\bmake ([a-z][a-z-]+)", DOCS))))
def test_every_make_target_of_the_readme_exists(target):
    assert target in TARGETS, f"README mentions `make {target}`, which the Makefile does not define"


@pytest.mark.parametrize("package, command", COMMANDS)
def test_every_cli_command_of_the_readme_exists(package, command):
    cli = importlib.import_module(f"{package}.__main__").cli
    names = set(cli.commands) if hasattr(cli, "commands") else set()
    assert command in names, f"`python -m {package} {command}` is not a command"


MAKEFILE = (ROOT / "Makefile").read_text()


def _make_variable(name: str) -> list[str]:
    (value,) = re.findall(rf"^{name} \?= (.*)$", MAKEFILE, re.M)
    return value.split()


def test_the_demo_builds_and_measures_the_models_the_readme_names():
    (line,) = [line for line in README.splitlines() if line.startswith("make demo ")]
    named = re.search(r"build ([\w ,+]+?), start", line).group(1).replace("+", " ").replace(",", " ").split()
    assert named == _make_variable("DEMO_MODELS"), line
    table = README.split("What `make demo` printed", 1)[1].split("```")[1]
    assert sorted(
        {row.split("|")[1].strip() for row in table.splitlines() if row.startswith("| ")} - {"model"}
    ) == sorted(named)


def test_every_make_variable_is_defined_once():
    names = re.findall(r"^([A-Z_]+) *[?:]?=", MAKEFILE, re.M)
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_no_process_is_ended_by_name():
    sources = [ROOT / "Makefile", *ROOT.glob("*/**/*.py"), *ROOT.glob(".ci/*"), *ROOT.glob("docker/*")]
    # the two commands' names are spelled in halves so that this test is not itself a match for them
    pattern = re.compile(r"\b(" + "p" + "kill|kill" + "all" + r")\b")
    hits = [
        str(p.relative_to(ROOT))
        for p in sources
        if not {".venv", ".tools"} & set(p.parts)  # installed, not ours
        and p.is_file()
        and p != Path(__file__)
        and pattern.search(p.read_text(errors="replace"))
    ]
    assert hits == []


def test_the_docs_name_every_port_variable():
    for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "HEALTH_PORT"):
        assert name in DOCS and f"{name} ?=" in MAKEFILE


def test_the_readme_links_every_guide():
    assert [name for name in GUIDES if f"](docs/{name}.md" not in README] == []
