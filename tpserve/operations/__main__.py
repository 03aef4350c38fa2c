"""Operations above the server and its clients: `python -m tpserve.operations rollout`."""

from pathlib import Path

import click

from tpserve.common.cli import private_files, user_errors
from tpserve.common.options import STATE_DIR


@click.group()
def cli():
    """Change what a running server serves, without downtime."""
    private_files()


@cli.command()
@click.option("--model", required=True, help="The served model to replace (e.g. digits_cnn).")
@click.option(
    "--from",
    "source",
    type=click.Path(path_type=Path),
    required=True,
    help="A repository written by make build-engines that holds the new build of MODEL.",
)
@click.option("--repo", type=click.Path(path_type=Path), help="The served repository (checked against the server's).")
@click.option("--http-port", type=int, help="The server's HTTP port (checked against the server's).")
@click.option(
    "--canary/--no-canary",
    default=True,
    show_default=True,
    help="Check the build beside the serving version before it takes traffic (needs room for both).",
)
@click.option(
    "--accuracy-tolerance",
    type=float,
    default=0.01,
    show_default=True,
    help="How far the served accuracy may fall below what the build recorded.",
)
@click.option(
    "--accuracy-budget",
    type=float,
    default=0.01,
    show_default=True,
    help="How far the served accuracy may fall below the serving version's.",
)
@click.option("--keep", type=click.IntRange(1), default=2, show_default=True, help="Version folders kept on disk.")
@click.option(
    "--share",
    default="",
    help="Canary by traffic share: percents of the model's HTTP traffic the edge sends the new build, step by "
    "step, e.g. '1 10 50 100'; each step held --hold seconds and gated on its errors and p99 against the old "
    "version's (rolled back on a breach).",
)
@click.option("--hold", type=float, default=30.0, show_default=True, help="Seconds each traffic share is held.")
@click.option(
    "--latency-ratio",
    type=click.FloatRange(min=1.0),
    default=1.5,
    show_default=True,
    help="Canary gate: the new build's p99 and mean latency may be this many times the old version's ...",
)
@click.option(
    "--latency-slack-ms",
    type=click.FloatRange(min=0.0),
    default=5.0,
    show_default=True,
    help="... plus this many milliseconds (raise both on a busy or shared host).",
)
@STATE_DIR
@user_errors
def rollout(
    model,
    source,
    repo,
    http_port,
    canary,
    accuracy_tolerance,
    accuracy_budget,
    keep,
    share,
    hold,
    latency_ratio,
    latency_slack_ms,
    state_dir,
):
    """Roll a new build of MODEL into the running server without downtime (rolls back on a failed check)."""
    from tpserve.clients.checks import Gate
    from tpserve.common.endpoints import read_state
    from tpserve.operations.canary import CanaryPlan
    from tpserve.operations.rollout import RolloutRequest, rollout

    _check_same_server(read_state(state_dir), repo, http_port, state_dir)
    gate = Gate(accuracy_tolerance, accuracy_budget)
    limits = {"latency_ratio": latency_ratio, "latency_slack_ms": latency_slack_ms}
    plan = CanaryPlan(steps=_percents(share), hold_s=hold, **limits) if share.strip() else None
    event = rollout(
        RolloutRequest(model=model, source=source, state_dir=state_dir, canary=canary, gate=gate, keep=keep, share=plan)
    )
    for done in event.get("checks", {}).get("steps", []):
        click.echo(f"  {done['percent']}%: {done['seconds']} s, new {done['candidate']}, old {done['old']}")
    click.echo(f"{model}: v{event['version']} serving (was v{event['previous']}); history in the manifest")


def _percents(share: str) -> tuple[int, ...]:
    """CANARY="1 10 50 100" as whole percents; a clear error otherwise."""
    from tpserve.common.errors import ServerError

    try:
        return tuple(int(p) for p in share.split())
    except ValueError:
        raise ServerError(f"CANARY={share!r}: whole percents separated by spaces, e.g. '1 10 50 100'") from None


def _check_same_server(state, repo, http_port, state_dir) -> None:
    from tpserve.common.errors import ServerError

    if repo is not None and repo.resolve() != Path(state.repo):
        raise ServerError(f"the server of {state_dir} serves {state.repo}, not REPO={repo}: pass its STATE_DIR")
    if http_port is not None and http_port != state.http_port:
        raise ServerError(f"the server of {state_dir} listens on HTTP port {state.http_port}, not {http_port}")


if __name__ == "__main__":
    cli()
