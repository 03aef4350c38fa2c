"""The README's commands exist: every `make <target>` is a Makefile target, every `python -m <package> <command>`
a command of that package's CLI."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
TARGETS = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
COMMANDS = sorted(set(re.findall(r"python -m (builders|server|clients|loadtest) ([a-z][a-z-]*)", README)))


@pytest.mark.parametrize("target", sorted(set(re.findall(r"(?<!--entrypoint )\bmake ([a-z][a-z-]+)", README))))
def test_every_make_target_of_the_readme_exists(target):
    assert target in TARGETS, f"README mentions `make {target}`, which the Makefile does not define"


@pytest.mark.parametrize("package, command", COMMANDS)
def test_every_cli_command_of_the_readme_exists(package, command):
    cli = importlib.import_module(f"{package}.__main__").cli
    names = set(cli.commands) if hasattr(cli, "commands") else set()
    assert command in names, f"`python -m {package} {command}` is not a command"
