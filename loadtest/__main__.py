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
@click.option(
    "--stability",
    type=float,
    default=10.0,
    show_default=True,
    help="perf_analyzer --stability-percentage: how close 3 windows must be.",
)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/<time>).")
@click.option("--url", default=None)
@click.option("--state-dir", type=click.Path(path_type=Path), default=Path(".triton"), show_default=True)
@user_errors
def perf(
    models, protocol, concurrency, request_rate, batch, shared_memory, interval_ms, stability, out, url, state_dir
):
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
                             shared_memory, interval_ms, stability_percent=stability)  # fmt: skip
        rows += sweeps.run_sweep(sweep, ep, analyzer, out / "raw")
    sweeps.write_csv(rows, out / "perf.csv")
    table = sweeps.markdown_table(rows)
    (out / "perf.md").write_text(f"# perf_analyzer sweep\n\n{table}\n")
    throughput_vs_latency(rows, out / "perf.png")
    click.echo(table)
    click.echo(f"report: {out}/perf.md (CSV: perf.csv, plot: perf.png)")


@cli.command()
@click.option("--models", default="digits_cnn", show_default=True, help="'model[:weight] ...'; several = mixed load.")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="grpc", show_default=True)
@click.option("--users", type=int, default=4, show_default=True)
@click.option("--spawn-rate", type=float, default=4, show_default=True)
@click.option("--run-time", type=int, default=10, show_default=True, help="Seconds.")
@click.option("--processes", type=int, default=0, help="Locust worker processes (distributed mode); 0: one process.")
@click.option("--rate-per-user", type=float, default=0.0, help="Open loop: requests/s per user (0: closed loop).")
@click.option("--shape", type=click.Choice(["constant", "step"]), default="constant", show_default=True)
@click.option("--slo-p99-ms", type=float, default=0.0, help="Fail the run if p99 exceeds this (0: off).")
@click.option("--slo-fail-ratio", type=float, default=-1.0, help="Fail the run if the failure ratio exceeds this.")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/<time>).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=Path(".triton"), show_default=True)
@user_errors
def locust(models, protocol, users, spawn_rate, run_time, processes, rate_per_user, shape, slo_p99_ms,
           slo_fail_ratio, batch, out, state_dir):  # fmt: skip
    """Headless Locust run against the server of `make serve`; CSV + HTML report, table printed."""
    from loadtest.locust_run import LocustRun, markdown_table, run_locust
    from server.launcher import read_state

    parsed = tuple((m.partition(":")[0], int(m.partition(":")[2] or 1)) for m in models.replace(",", " ").split())
    run = LocustRun(parsed, protocol, users, spawn_rate, run_time, processes, rate_per_user, shape, slo_p99_ms,
                    slo_fail_ratio, batch)  # fmt: skip
    out = out or Path("reports") / time.strftime("%Y%m%d-%H%M%S")
    result = run_locust(run, read_state(state_dir), out)
    table = markdown_table(result["rows"])
    (out / "locust.md").write_text(f"# Locust run\n\n{table}\n")
    click.echo(table)
    click.echo(f"report: {out}/locust.md (CSV: locust_stats.csv, HTML: locust.html, log: locust.log)")
    if not result["slo_ok"]:
        raise SystemExit("SLO breached: see the log")
    if result["exit_code"]:
        raise SystemExit("some requests failed: see the table and the log")


@cli.command("gpu-bench")
@click.option("--model", default="resnet50", show_default=True)
@click.option("--gpu-batch", type=int, default=256, show_default=True, help="In-process GPU batch and max batch.")
@click.option("--cpu-batch", type=int, default=8, show_default=True)
@click.option(
    "--served-points",
    default="64x4 128x4 64x8 256x2",
    show_default=True,
    help="(batch)x(concurrency) points for served throughput; the best is reported.",
)
@click.option("--instances", type=int, default=2, show_default=True, help="GPU instances per served variant.")
@click.option("--interval-ms", type=int, default=3000, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def gpu_bench(model, gpu_batch, cpu_batch, served_points, instances, interval_ms, out):
    """CPU vs GPU vs TensorRT for MODEL, in-process and served, in one run (the seeds' table)."""
    from loadtest import gpu_bench as bench

    out = out or Path("reports") / time.strftime("gpu-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    points = tuple(tuple(int(v) for v in p.split("x")) for p in served_points.split())
    settings = bench.BenchSettings(model, gpu_batch, cpu_batch, points, instances, interval_ms)
    bench.run(settings, out)
    click.echo((out / "gpu_bench.md").read_text())
    click.echo(f"report: {out}/gpu_bench.md (CSV: gpu_bench.csv, plot: gpu_bench.png)")


if __name__ == "__main__":
    cli()
