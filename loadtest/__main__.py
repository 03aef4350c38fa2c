"""Measurement commands: `python -m loadtest perf|install-perf-analyzer`."""

import time
from pathlib import Path

import click

from builders.cli_support import user_errors


@click.group()
def cli():
    """Measure a running Triton server: perf_analyzer sweeps, reports."""


def _numbers(text: str, kind=int) -> tuple:
    return tuple(kind(v) for v in text.replace(",", " ").split())


@cli.command("install-perf-analyzer")
@user_errors
def install_perf_analyzer():
    """Install a perf_analyzer that runs on this host (idempotent)."""
    from loadtest.perf_tools import install_perf_analyzer as install

    click.echo(f"perf_analyzer: {install().binary}")


@cli.command()
@click.option("--models", default="digits_cnn", show_default=True, help="Models or ensembles, space-separated.")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="grpc", show_default=True)
@click.option("--concurrency", default="1 2 4", show_default=True, help="Concurrency levels ('' for none).")
@click.option("--request-rate", default="", help="Request rates (open loop), e.g. '50 100'.")
@click.option("--batch", default="1", show_default=True, help="Batch sizes.")
@click.option("--shared-memory", type=click.Choice(["none", "system", "cuda"]), default="none", show_default=True)
@click.option("--interval-ms", type=int, default=2000, show_default=True, help="perf_analyzer measurement window.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/<time>).")
@click.option("--url", default=None)
@click.option("--state-dir", type=click.Path(path_type=Path), default=Path(".triton"), show_default=True)
@user_errors
def perf(models, protocol, concurrency, request_rate, batch, shared_memory, interval_ms, out, url, state_dir):
    """Sweep MODELS with perf_analyzer; write perf.csv, perf.md and a PNG plot; print the table."""
    from clients.connection import endpoint
    from loadtest import perf as sweeps
    from loadtest.perf_tools import find_perf_analyzer
    from loadtest.plots import throughput_vs_latency

    ep, analyzer = endpoint(protocol, url, state_dir), find_perf_analyzer()
    out = out or Path("reports") / time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for model in models.replace(",", " ").split():
        sweep = sweeps.Sweep(model, protocol, _numbers(concurrency), _numbers(request_rate, float), _numbers(batch),
                             shared_memory, interval_ms)  # fmt: skip
        rows += sweeps.run_sweep(sweep, ep, analyzer, out / "raw")
    sweeps.write_csv(rows, out / "perf.csv")
    table = sweeps.markdown_table(rows)
    (out / "perf.md").write_text(f"# perf_analyzer sweep\n\n{table}\n")
    throughput_vs_latency(rows, out / "perf.png")
    click.echo(table)
    click.echo(f"report: {out}/perf.md (CSV: perf.csv, plot: perf.png)")


if __name__ == "__main__":
    cli()
