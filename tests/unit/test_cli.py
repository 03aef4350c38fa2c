"""The `tpserve` command the README names: installed on the environment's PATH, its subcommands the parts' own
commands (so `tpserve serve` takes exactly what `python -m tpserve.server start` takes)."""

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tpserve.cli import PARTS, STEPS, main


def test_every_subcommand_is_the_parts_own_command():
    import importlib

    for name, (module, command) in {**STEPS, **PARTS}.items():
        part = importlib.import_module(module).cli
        assert main.get_command(None, name) is (part.commands[command] if command else part), name
    for name in ("build", "serve", "stop", "perf", "loadtest", "replay", "infer", "status"):
        assert name in STEPS


def test_the_command_is_on_the_environments_path_and_answers_help():
    tpserve = Path(sys.executable).with_name("tpserve")
    assert tpserve.exists(), "pip install puts `tpserve` beside the interpreter ([project.scripts])"
    done = subprocess.run([str(tpserve), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and all(f"  {n} " in done.stdout for n in ("build", "serve", "stop", "perf"))
    serve = CliRunner().invoke(main, ["serve", "--help"])
    assert serve.exit_code == 0 and "--max-waiting" in serve.output and "--repo" in serve.output
