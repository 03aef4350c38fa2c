"""`tpserve`, the command on PATH: the everyday steps as subcommands, and every part's own commands under its name.

    tpserve build --models resnet50        = python -m tpserve.builders build ...
    tpserve serve / stop / status          = python -m tpserve.server start / stop / status
    tpserve perf / loadtest / replay       = python -m tpserve.loadtest perf / locust / replay
    tpserve infer                          = python -m tpserve.clients infer
    tpserve server cluster ...             (any command of a part: builders, server, loadtest, clients, operations)

Subcommands load their part only when run, so `tpserve --help` stays quick.
"""

from __future__ import annotations

import importlib

import click

from tpserve.common.cli import clean_exit_on_sigterm, private_files

# subcommand -> (the part's command-line module, its command)
STEPS = {
    "build": ("tpserve.builders.__main__", "build"),
    "engines": ("tpserve.builders.__main__", "engines"),
    "serve": ("tpserve.server.__main__", "start"),
    "stop": ("tpserve.server.__main__", "stop"),
    "status": ("tpserve.server.__main__", "status"),
    "cluster": ("tpserve.server.__main__", "cluster"),
    "infer": ("tpserve.clients.__main__", "infer"),
    "perf": ("tpserve.loadtest.__main__", "perf"),
    "loadtest": ("tpserve.loadtest.__main__", "locust"),
    "replay": ("tpserve.loadtest.__main__", "replay"),
    "search": ("tpserve.loadtest.__main__", "search"),
    "plan": ("tpserve.loadtest.__main__", "plan"),
    "rollout": ("tpserve.operations.__main__", "rollout"),
}
# a part's whole group, under its name
PARTS = {name: (f"tpserve.{name}.__main__", None) for name in ("builders", "server", "clients", "operations")}
PARTS["measure"] = ("tpserve.loadtest.__main__", None)
SAYS = {
    "build": "Export, check and write a Triton model repository (python -m tpserve.builders build).",
    "engines": "TensorRT plans for a built repository (python -m tpserve.builders engines).",
    "serve": "Start tritonserver on a repository, supervised, behind the edge (python -m tpserve.server start).",
    "stop": "Stop what serve, cluster or monitoring started (python -m tpserve.server stop).",
    "status": "What the server of a state folder serves (python -m tpserve.server status).",
    "cluster": "Several supervised servers behind Envoy (python -m tpserve.server cluster).",
    "infer": "Send a request to any Triton and check its answer (python -m tpserve.clients infer).",
    "perf": "perf_analyzer sweeps against any Triton (python -m tpserve.loadtest perf).",
    "loadtest": "A Locust run against any Triton (python -m tpserve.loadtest locust).",
    "replay": "Replay a recording open loop (python -m tpserve.loadtest replay).",
    "search": "Search serving configurations for the best one (python -m tpserve.loadtest search).",
    "plan": "How much to run for GROWTH x a recording's traffic at a p99 SLO (python -m tpserve.loadtest plan).",
    "rollout": "Replace a served model without downtime (python -m tpserve.operations rollout).",
    "builders": "Every build command.",
    "server": "Every server command.",
    "clients": "Every client command.",
    "operations": "Every operations command.",
    "measure": "Every measurement command (python -m tpserve.loadtest).",
}


class Lazy(click.Group):
    """A group whose subcommands are imported when one is run (or its help is asked for)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*STEPS, *PARTS]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        where = STEPS.get(name) or PARTS.get(name)
        if where is None:
            return None
        module, command = where
        part = importlib.import_module(module).cli
        return part.commands[command] if command else part

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SAYS[name]) for name in self.list_commands(ctx)])


@click.group(cls=Lazy)
def main() -> None:
    """Serve PyTorch models with NVIDIA Triton: build a repository, serve it, measure it."""
    private_files()
    clean_exit_on_sigterm()  # what a command started (a bench's servers) is stopped when it is stopped


if __name__ == "__main__":
    main()
