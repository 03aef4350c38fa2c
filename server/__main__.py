"""Command line of the launcher: `python -m server start|stop|status`."""

from pathlib import Path

import click

from builders.cli_support import step, user_errors

STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path(".triton"),
    show_default=True,
    help="Holds the pid, ports, log and admin key of the server.",
)


@click.group()
def cli():
    """Run the embedded tritonserver on a model repository."""


@cli.command()
@click.option("--repo", type=click.Path(path_type=Path), default=Path("model_repository"), show_default=True)
@click.option("--http-port", type=int, default=8000, show_default=True)
@click.option("--grpc-port", type=int, default=8001, show_default=True)
@click.option("--metrics-port", type=int, default=8002, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (keep loopback: see README).")
@click.option("--model-control", type=click.Choice(["none", "explicit", "poll"]), default="none", show_default=True)
@click.option("--timeout", type=float, default=180.0, show_default=True, help="Seconds to wait for readiness.")
@STATE_DIR
@user_errors
def start(repo, http_port, grpc_port, metrics_port, host, model_control, timeout, state_dir):
    """Start the server and return once every model is ready."""
    from server.launcher import ServerSettings, start

    step(f"starting tritonserver on {repo} (http {http_port}, grpc {grpc_port}, metrics {metrics_port})")
    settings = ServerSettings(repo, http_port, grpc_port, metrics_port, host, state_dir, timeout, model_control)
    state = start(settings)
    click.echo(f"tritonserver ready: pid {state.pid}, http {state.http_url}, grpc {state.grpc_url}, log {state.log}")
    click.echo(f"admin key (header '{'admin-key'}') in {state.admin_key_file}")


@cli.command()
@STATE_DIR
def stop(state_dir):
    """Stop the server started from STATE_DIR."""
    from server.launcher import stop

    click.echo("tritonserver stopped" if stop(state_dir) else "no tritonserver was running")


@cli.command()
@STATE_DIR
@user_errors
def status(state_dir):
    """Show the running server's pid, ports and log."""
    from server.launcher import read_state

    state = read_state(state_dir)
    click.echo(f"pid {state.pid}, http {state.http_url}, grpc {state.grpc_url}, repo {state.repo}, log {state.log}")


if __name__ == "__main__":
    cli()
