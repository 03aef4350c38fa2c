"""Measurement commands: `python -m loadtest perf|install-perf-analyzer`."""

import json
import sys
import time
from pathlib import Path

import click

from common import options
from common.cli import private_files, user_errors
from common.errors import MeasurementError


@click.group()
def cli():
    """Measure a running Triton server: perf_analyzer sweeps, reports."""
    private_files()


def _names(text: str) -> tuple[str, ...]:
    """'a b,c' -> ('a', 'b', 'c')."""
    return tuple(text.replace(",", " ").split())


def _numbers(text: str, kind=int) -> tuple:
    return tuple(kind(v) for v in text.replace(",", " ").split())


@cli.command("install-perf-analyzer")
@user_errors
def install_perf_analyzer():
    """Install a perf_analyzer that runs on this host (idempotent)."""
    from loadtest.perf.tools import install_perf_analyzer as install

    click.echo(f"perf_analyzer: {install().binary}")


@cli.command("install-prometheus")
@user_errors
def install_prometheus():
    """Unpack Debian's Prometheus into .tools/prometheus (no root, no service; idempotent)."""
    from loadtest.monitoring.prometheus_tools import install_prometheus as install

    click.echo(f"prometheus: {install()}")


@cli.command()
@click.option("--models", default="", help="Models or ensembles, space-separated (default: the manifest's models).")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="grpc", show_default=True)
@click.option("--concurrency", default="1 2 4", show_default=True, help="Concurrency levels ('' for none).")
@click.option("--request-rate", default="", help="Request rates (open loop), e.g. '50 100'.")
@click.option("--batch", default="1", show_default=True, help="Batch sizes.")
@click.option("--shared-memory", type=click.Choice(["none", "system", "cuda"]), default="none", show_default=True)
@click.option("--interval-ms", type=int, default=2000, show_default=True, help="perf_analyzer measurement window.")
@click.option(
    "--stability",
    type=float,
    default=25.0,
    show_default=True,
    help="perf_analyzer --stability-percentage (its own default, 10, rarely holds on a small shared host).",
)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/<time>).")
@options.URL
@options.HEADER
@options.SHAPE
@options.INPUT_DATA
@options.LENGTHS
@options.TLS
@options.CA_FILE
@options.STATE_DIR
@user_errors
def perf(
    models,
    protocol,
    concurrency,
    request_rate,
    batch,
    shared_memory,
    interval_ms,
    stability,
    out,
    url,
    headers,
    shapes,
    input_data,
    lengths,
    tls,
    ca_file,
    state_dir,
):
    """Sweep MODELS with perf_analyzer; write perf.csv, perf.md and a PNG plot; print the table."""
    from clients.connection import endpoint, parse_headers
    from clients.model_plan import parse_shapes
    from loadtest.perf.run import PerfRequest, run

    ep = endpoint(protocol, url, state_dir, parse_headers(headers), tls, ca_file)
    request = PerfRequest(
        models=_names(models),
        protocol=protocol,
        concurrency=_numbers(concurrency),
        request_rate=_numbers(request_rate, float),
        batches=_numbers(batch),
        shared_memory=shared_memory,
        interval_ms=interval_ms,
        stability=stability,
        shapes=parse_shapes(shapes),
        input_data=input_data,
        lengths=lengths,
        out=out or Path("reports") / time.strftime("%Y%m%d-%H%M%S"),
    )
    result = run(request, ep)
    click.echo(result.text)
    click.echo(f"report: {result.report} (and report.html; CSV: perf.csv, plots: *.png)")
    if result.failed:
        raise SystemExit(f"{result.failed} of {result.total} points failed (table above); the finished points are kept")


@cli.command()
@click.option(
    "--models", default="", help="'model[:weight] ...'; several = mixed load (default: the manifest's models)."
)
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="grpc", show_default=True)
@click.option("--users", type=int, default=4, show_default=True)
@click.option("--spawn-rate", type=float, default=4, show_default=True)
@click.option("--run-time", type=int, default=10, show_default=True, help="Seconds.")
@click.option("--processes", type=int, default=0, help="Locust worker processes (distributed mode); 0: one process.")
@click.option("--rate-per-user", type=float, default=0.0, help="Open loop: requests/s per user (0: closed loop).")
@click.option(
    "--load-shape",
    type=click.Choice(["constant", "step", "burst"]),
    default="constant",
    show_default=True,
    help="Users all at once, added in steps, or in bursts (BURST_ON_SECONDS, BURST_OFF_SECONDS).",
)
@click.option("--slo-p99-ms", type=float, default=0.0, help="Fail the run if p99 exceeds this (0: off).")
@click.option("--slo-fail-ratio", type=float, default=-1.0, help="Fail the run if the failure ratio exceeds this.")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/<time>).")
@options.URL
@options.HEADER
@options.SHAPE
@options.INPUT_DATA
@options.LENGTHS
@options.TLS
@options.CA_FILE
@options.STATE_DIR
@user_errors
def locust(
    models,
    protocol,
    users,
    spawn_rate,
    run_time,
    processes,
    rate_per_user,
    load_shape,
    slo_p99_ms,
    slo_fail_ratio,
    batch,
    out,
    url,
    headers,
    shapes,
    input_data,
    lengths,
    tls,
    ca_file,
    state_dir,
):
    """Headless Locust run against the server of `make serve` or any Triton (--url); CSV + HTML report."""
    from clients.connection import endpoint, parse_headers
    from clients.model_plan import parse_shapes
    from loadtest.locust_suite.run import LocustRun, load_test, weighted

    ep = endpoint(protocol, url, state_dir, parse_headers(headers), tls, ca_file)
    run = LocustRun(
        models=weighted(_names(models)),
        protocol=protocol,
        users=users,
        spawn_rate=spawn_rate,
        run_time_s=run_time,
        processes=processes,
        rate_per_user=rate_per_user,
        shape=load_shape,
        slo_p99_ms=slo_p99_ms,
        slo_fail_ratio=slo_fail_ratio,
        batch=batch,
        shapes=parse_shapes(shapes),
        input_data=str(input_data or ""),
        lengths=lengths,
        headers=ep.headers,
        tls=tls,
        ca_file=ca_file or "",
    )
    table, report, result = load_test(ep, run, out or Path("reports") / time.strftime("%Y%m%d-%H%M%S"))
    click.echo(table)
    click.echo(f"report: {report} (and report.html; Locust: locust_stats.csv, locust.html, locust.log)")
    if not result["slo_ok"]:
        raise SystemExit("SLO breached: see the log")
    if result["exit_code"]:
        raise SystemExit("some requests failed: see the table and the log")


@cli.command()
@options.REPO
@click.option(
    "--variants",
    default="",
    help="Variants of one model (e.g. 'digits_cnn digits_cnn_int8') to choose among; "
    "default: the first model of the manifest and the variants built from it.",
)
@click.option("--mode", type=click.Choice(["quick", "exhaustive", "both"]), default="quick", show_default=True)
@click.option("--p99-ms", type=float, default=50.0, show_default=True, help="Latency budget.")
@click.option(
    "--accuracy-budget",
    type=float,
    default=0.01,
    show_default=True,
    help="Largest accuracy gap to the best variant (from the manifest).",
)
@click.option("--concurrency", type=int, default=8, show_default=True)
@click.option("--max-instances", type=int, default=2, show_default=True)
@click.option("--delays-us", default="0 100 1000 5000", show_default=True)
@click.option("--interval-ms", type=int, default=1500, show_default=True)
@click.option("--write-back/--no-write-back", default=True, show_default=True)
@options.SHAPE
@options.INPUT_DATA
@click.option(
    "--replay",
    "replayed",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Measure each candidate on this recording (or fitted workload file) replayed open loop, instead of "
    "perf_analyzer: the lowest p99 wins, a failed request disqualifies.",
)
@click.option("--speed", type=float, default=1.0, show_default=True, help="The replay's speed (a workload: its scale).")
@click.option("--replay-seconds", type=float, default=60.0, show_default=True, help="The replay's first seconds.")
@click.option(
    "--replay-model", default="", help="Whose recorded traffic is sent to each candidate (default: the first variant)."
)
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def search(
    repo,
    variants,
    mode,
    p99_ms,
    accuracy_budget,
    concurrency,
    max_instances,
    delays_us,
    interval_ms,
    write_back,
    shapes,
    input_data,
    replayed,
    speed,
    replay_seconds,
    replay_model,
    out,
):
    """Find the best serving config on a real server (explicit model control); write the winner back.

    Any repository `make serve` serves: only config.pbtxt is edited (instance groups, dynamic batching, queue
    delay), and only the winner's; every other file stays as it was."""
    from clients.model_plan import parse_shapes
    from loadtest import search as s

    out = out or Path("reports") / time.strftime("search-%Y%m%d-%H%M%S")
    measure = {"concurrency": concurrency, "interval_ms": interval_ms}
    measure.update(shapes=parse_shapes(shapes), input_data=input_data)
    if replayed is not None:
        measure["replay"] = s.replay_workload(replayed, speed, replay_seconds, replay_model or _names(variants)[:1])
    request = s.SearchRun(
        repo=repo,
        out=out,
        variants=tuple(variants.split()),
        mode=mode,
        budgets={"p99_ms": p99_ms, "accuracy": accuracy_budget},
        measure=measure,
        max_instances=max_instances,
        delays_us=_numbers(delays_us),
        write_back=write_back,
    )
    click.echo(s.run(request))
    click.echo(f"report: {out}/search.md")


@cli.command()
@click.option("--models", default="", help="Models to reconcile on (p50 >> 1 ms); default: every ready model.")
@options.URL
@options.HEADER
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="grpc", show_default=True)
@click.option("--concurrency", type=int, default=4, show_default=True)
@click.option("--seconds", type=int, default=12, show_default=True, help="Per tool and model.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@options.STATE_DIR
@user_errors
def reconcile(models, protocol, concurrency, seconds, out, url, headers, state_dir):
    """Locust vs perf_analyzer p50 at matched load on the server of `make serve` or any Triton (agree within 15%?)."""
    from clients.connection import endpoint, parse_headers
    from loadtest.benches import reconcile as rec
    from loadtest.locust_suite.run import Target
    from loadtest.perf.run import served_or_given
    from loadtest.perf.tools import find_perf_analyzer

    out = out or Path("reports") / time.strftime("reconcile-%Y%m%d-%H%M%S")
    ep, analyzer = endpoint(protocol, url, state_dir, parse_headers(headers)), find_perf_analyzer()
    state = Target.of(ep)
    names = served_or_given(_names(models), ep).names
    results = [rec.reconcile(state, ep, analyzer, m, concurrency, seconds, out / m) for m in names]
    text = rec.markdown(results)
    (out / "reconcile.md").write_text(f"# Locust vs perf_analyzer\n\n{text}\n")
    click.echo(text)
    click.echo(f"report: {out}/reconcile.md")


@cli.command()
@click.option("--model", default="digits_cnn_pipeline", show_default=True, help="Model or pipeline to load.")
@click.option("--minutes", type=float, default=10.0, show_default=True)
@click.option("--interval", type=float, default=10.0, show_default=True, help="Seconds between RSS samples.")
@click.option("--clients", type=int, default=1, show_default=True, help="Closed-loop clients per protocol.")
@click.option("--protocols", default="http grpc", show_default=True)
@click.option("--warmup", type=float, default=60.0, show_default=True, help="Seconds before growth is measured.")
@click.option("--max-growth", type=float, default=5.0, show_default=True, help="Goal: RSS growth per process, %.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@click.option("--url", default=None, help="HOST:PORT of any Triton (RSS is then not sampled); one of --protocols.")
@options.HEADER
@options.STATE_DIR
@user_errors
def soak(model, minutes, interval, clients, protocols, warmup, max_growth, out, url, headers, state_dir):
    """Bounded load for MINUTES with RSS of tritonserver, each stub, the supervisor and Envoy sampled; exits 1 if
    the goal is missed."""
    from clients.connection import endpoint, parse_headers
    from loadtest.benches.soak import SoakSettings, run, served_processes

    names = tuple(protocols.split())
    if url and len(names) != 1:
        raise MeasurementError("--url is one port: give the one protocol it speaks (--protocols http or grpc)")
    settings = SoakSettings(model, minutes * 60, interval, clients, names, warmup, max_growth)
    out = out or Path("reports") / time.strftime("soak-%Y%m%d-%H%M%S")
    endpoints = [endpoint(p, url, state_dir, parse_headers(headers)) for p in names]
    # tritonserver, its stubs, the supervisor and Envoy, as the state folder names them; a server not ours: none
    sampled = (lambda: None) if url else (lambda: served_processes(state_dir))
    summary = run(settings, endpoints, sampled, out)
    click.echo((out / "soak.md").read_text())
    click.echo(f"report: {out}/soak.md")
    sys.exit(0 if summary["goal_met"] else 1)


@cli.command("envoy-bench")
@click.option("--model", default="digits_cnn", show_default=True)
@click.option("--protocols", default="http grpc", show_default=True)
@click.option("--concurrency", default="1 4", show_default=True)
@click.option("--interval-ms", type=int, default=3000, show_default=True, help="perf_analyzer measurement window.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@options.STATE_DIR
@user_errors
def envoy_bench(model, protocols, concurrency, interval_ms, out, state_dir):
    """perf_analyzer through Envoy vs straight to replica-0 of `make cluster` (REPLICAS=1 isolates Envoy)."""
    from loadtest.benches import envoy_bench as bench
    from loadtest.perf.tools import find_perf_analyzer
    from server.cluster import read_cluster

    read_cluster(state_dir)  # a cluster runs there, or say how to start one
    out = out or Path("reports") / time.strftime("envoy-%Y%m%d-%H%M%S")
    rows = bench.measure(
        state_dir,
        model,
        protocols.split(),
        _numbers(concurrency),
        find_perf_analyzer(),
        out,
        measurement_ms=interval_ms,
        stability_percent=50.0,
        max_trials=10,
    )
    click.echo(bench.write(bench.compare(rows), rows, out))
    click.echo(f"report: {out}/envoy.md")


@cli.command()
@click.option(
    "--from",
    "recording",
    type=click.Path(path_type=Path),
    default=None,
    help="A recording: STATE_DIR/traffic of `make serve RECORD=1`, or one of its files.",
)
@click.option("--speed", type=float, default=1.0, show_default=True, help="3: the same requests three times as fast.")
@click.option(
    "--workload",
    type=click.Path(path_type=Path),
    default=None,
    help="A fitted workload file (python -m loadtest fit-workload) instead of a recording.",
)
@click.option("--scale", type=float, default=1.0, show_default=True, help="A workload's rates times this.")
@click.option("--seed", type=int, default=0, show_default=True, help="A workload's draws.")
@click.option(
    "--protocol",
    type=click.Choice(["", "http", "grpc"]),
    default="",
    help="Send everything over this protocol (default: each request's own; with --url, required).",
)
@click.option("--models", default="", help="Replay only these models (default: all).")
@click.option("--connections", type=int, default=64, show_default=True, help="HTTP connections at most.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/<time>).")
@options.URL
@options.HEADER
@options.TLS
@options.CA_FILE
@options.STATE_DIR
@user_errors
def replay(
    recording, speed, workload, scale, seed, protocol, models, connections, out, url, headers, tls, ca_file, state_dir
):
    """Replay a recording open loop through Locust (arrival times, models, protocols, shapes) against the server
    of `make serve` or any Triton (--url with --protocol); report recorded and replayed side by side."""
    from clients.connection import endpoint, parse_headers
    from loadtest.locust_suite.replay import Replay, run_replay
    from loadtest.reporting.replay_report import summarize, write_report

    if url and not protocol:
        raise click.UsageError("--url names one endpoint: give its protocol (PROTOCOL=http or grpc with make)")
    if (recording is None) == (workload is None):
        raise click.UsageError("give a recording (--from, FROM=) or a workload (--workload, WORKLOAD=), one of them")
    eps = {p: endpoint(p, url, state_dir, parse_headers(headers), tls, ca_file) for p in ("http", "grpc")}
    given = Replay(
        recording=recording,
        workload=workload,
        scale=scale,
        seed=seed,
        speed=speed,
        protocol=protocol,
        models=tuple(_names(models)),
        headers=parse_headers(headers),
        tls=tls,
        ca_file=ca_file or "",
        connections=connections,
    )
    out = out or Path("reports") / time.strftime("replay-%Y%m%d-%H%M%S")
    result = run_replay(given, eps["http"].url, eps["grpc"].url, eps["http"].repo, out)
    summary = summarize(result, speed if workload is None else 1.0)
    where = url or f"{eps['http'].url} (http), {eps['grpc'].url} (grpc)"
    given = f"--from {recording} --speed {speed:g}" if workload is None else f"--workload {workload} --scale {scale:g}"
    header = (
        f"{'Recording' if workload is None else 'Workload'} {recording or workload}, against {where}; "
        f"protocol: {protocol or 'as recorded'}. Command: `python -m loadtest replay {given}`"
    )
    _show_report(write_report(summary, out, header))


@cli.command("fit-workload")
@click.option("--from", "recording", type=click.Path(path_type=Path), required=True, help="A recording.")
@click.option("--bin-seconds", type=float, default=10.0, show_default=True, help="The rate's time resolution.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("workload.json"), show_default=True)
@user_errors
def fit_workload(recording, bin_seconds, out):
    """A workload file from a recording: per model, the rate over time, its burstiness, protocols, shapes (no data)."""
    from common.traffic import read_recording
    from loadtest.workloads.fitted import fit, write_workload

    workload = fit(list(read_recording(recording)), bin_seconds, source=str(recording))
    write_workload(workload, out)
    for model, fitted in workload["models"].items():
        click.echo(
            f"{model}: {fitted['requests']} requests, peak {max(fitted['rate_per_s'])}/s, gap variation "
            f"{fitted['gap_cv']}, {len(fitted['shapes'])} shapes, protocols {fitted['protocols']}"
        )
    click.echo(f"workload: {out} ({workload['duration_s']:.0f} s; replay it with `make loadtest WORKLOAD={out}`)")


@cli.command("compare-recordings")
@click.option("--recorded", type=click.Path(path_type=Path), required=True, help="The recording that was replayed.")
@click.option(
    "--replayed", type=click.Path(path_type=Path), required=True, help="The server's recording of the replay."
)
@click.option("--speed", type=float, default=1.0, show_default=True, help="The replay's speed.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def compare_recordings(recorded, replayed, speed, out):
    """A replay as the server saw it (`make serve RECORD=1` during the replay) against the recording replayed:
    per-second correlation, totals, shape histograms."""
    from common.traffic import read_recording
    from loadtest.reporting.replay_report import compare_recordings as compare
    from loadtest.reporting.replay_report import write_comparison

    found = compare(list(read_recording(recorded)), list(read_recording(replayed, replayed=True)), speed)
    out = out or Path("reports") / time.strftime("recordings-%Y%m%d-%H%M%S")
    header = (
        f"Recorded: {recorded}; replayed at speed {speed:g}, recorded again by the server: {replayed}. Command: "
        f"`python -m loadtest compare-recordings --recorded {recorded} --replayed {replayed} --speed {speed:g}`"
    )
    _show_report(write_comparison(found, out, header))


def _show_report(path: Path) -> None:
    """A markdown report's text up to its plot, then where it is."""
    click.echo(path.read_text().split("\n\n![")[0])
    click.echo(f"report: {path}")


@cli.command("record-bench")
@options.REPO
@click.option("--models", default="digits_cnn", show_default=True, help="Measured as `loadtest perf` measures them.")
@click.option("--protocols", default="http grpc", show_default=True)
@click.option("--concurrency", type=int, default=4, show_default=True)
@click.option("--rounds", type=int, default=3, show_default=True, help="Each setup this many times, alternated.")
@click.option("--interval-ms", type=int, default=3000, show_default=True, help="perf_analyzer measurement window.")
@click.option(
    "--setups",
    default=None,
    help="Only some setups, by number: 1 edge (the baseline), 2 recording, 3 recording values, 4 make serve default, "
    "5 recording with gRPC read by the Lua, as before the native reader, 6 a second edge like the first (the "
    'control: the noise alone) (e.g. "1 2 6"). Default: all.',
)
@click.option(
    "--together",
    is_flag=True,
    help="Start every setup's server once and alternate the points among them (no restarts between the points "
    "compared); default: each setup started and stopped round by round.",
)
@click.option(
    "--one-server",
    is_flag=True,
    help="One server, with every setup's Envoy in front of it (implies --together): the points compared differ "
    "in the edge alone, not also in the server.",
)
@click.option(
    "--fresh-edges",
    type=click.IntRange(min=0),
    default=0,
    help="Every setup, the edge too, through Envoys of its own in front of one server, new ones every this many "
    "rounds (an Envoy keeps a speed of its own while it runs); 0: off.",
)
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def record_bench(
    repo, models, protocols, concurrency, rounds, interval_ms, setups, together, one_server, fresh_edges, out
):
    """What RECORD=1 and RECORD=values cost: perf_analyzer through the edge, recording off and on, alternated."""
    from builders.environment import host_info
    from loadtest.benches import record_bench as bench

    out = (out or Path("reports") / time.strftime("record-%Y%m%d-%H%M%S")).absolute()
    names = _names(models)
    chosen = bench.chosen_setups(setups)
    rows = bench.measure(
        repo, names, chosen, protocols.split(), concurrency, rounds, out, interval_ms, together, one_server, fresh_edges
    )
    header = (
        f"Models {', '.join(names)}, perf_analyzer concurrency {concurrency}, {interval_ms} ms windows, "
        f"{rounds} rounds alternated; command: `python -m loadtest record-bench --repo {repo} --models "
        f'"{models}" --protocols "{protocols}" --rounds {rounds} --interval-ms {interval_ms}'
        + (f' --setups "{setups}"' if setups else "")
        + (" --together" if together else "")
        + (" --one-server" if one_server else "")
        + (f" --fresh-edges {fresh_edges}" if fresh_edges else "")
        + f"`. Host: {host_info()}"
    )
    click.echo(bench.write(bench.compare(rows), rows, out, header))
    click.echo(f"report: {out}/record.md")


@cli.command("record-bench-report")
@click.argument("points", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--title", default="", help="A line on how the points were measured (the runs' commands).")
@user_errors
def record_bench_report(points, out, title):
    """The record-bench table again from saved record_points.csv files: several runs of one command pooled,
    each round kept with its own run."""
    from loadtest.benches import record_bench as bench

    rows = bench.read_points(points)
    header = title or f"Pooled from {len(points)} run(s): {', '.join(str(p) for p in points)}."
    click.echo(bench.write(bench.compare(rows), rows, out.absolute(), header))
    click.echo(f"report: {out.absolute()}/record.md")


@cli.command("kubernetes-monitoring")
@click.option("--folder", type=click.Path(path_type=Path, file_okay=False), default=Path("kubernetes"))
def kubernetes_monitoring(folder):
    """(Re)write the PrometheusRule and prometheus-adapter manifests from loadtest/monitoring/prometheus_rules.py."""
    from loadtest.monitoring.kubernetes import write_kubernetes

    for path in write_kubernetes(folder):
        click.echo(f"wrote {path}")


@cli.command()
@click.argument("action", type=click.Choice(["start", "stop"]))
@click.option("--port", type=int, default=9090, show_default=True, help="Prometheus' web port (on 127.0.0.1).")
@click.option("--interval", default="5s", show_default=True, help="Scrape and rule evaluation interval.")
@options.STATE_DIR
@user_errors
def prometheus(action, port, interval, state_dir):
    """Start (or stop) a Prometheus scraping the server or cluster of STATE_DIR, with the Triton rules."""
    from loadtest.monitoring import prometheus_server as prom

    if action == "stop":
        click.echo("prometheus stopped" if prom.stop(state_dir) else "no prometheus was running")
        return
    from server.launcher import check_port_free

    check_port_free("127.0.0.1", "prometheus", port)
    state = prom.start(state_dir, port, interval)
    click.echo(f"prometheus: {state['url']} (config and rules in {state['folder']})")


@cli.command("multi-gpu-bench")
@click.option("--model", default="resnet50", show_default=True)
@click.option("--gpus", type=int, default=2, show_default=True)
@click.option("--instances-per-gpu", type=int, default=2, show_default=True)
@click.option("--batch", type=int, default=512, show_default=True)
@click.option("--concurrency-per-gpu", type=int, default=4, show_default=True)
@click.option("--work", type=click.Path(path_type=Path), default=Path("build/multi_gpu"), show_default=True)
@click.option("--build-only", is_flag=True, help="Build the engine into WORK and stop (a later run reuses it).")
@click.option("--envoy", is_flag=True, help="Also: one replica per GPU behind Envoy vs direct, over the wire.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def multi_gpu_bench(model, gpus, instances_per_gpu, batch, concurrency_per_gpu, work, build_only, envoy, out):
    """1 GPU vs 1 server on every GPU vs 1 replica per GPU, compiled ResNet-50, side by side (needs CUDA GPUs)."""
    from loadtest.benches.multi_gpu_bench import MultiGpuSettings, build, run

    settings = MultiGpuSettings(model, gpus, instances_per_gpu, batch, concurrency_per_gpu, envoy=envoy)
    if build_only:
        click.echo(f"built {build(settings, work)[1]} in {work}")
        return
    out = out or Path("reports") / time.strftime("multi-gpu-%Y%m%d-%H%M%S")
    rows = run(settings, work, out)
    click.echo((out / "multi_gpu.md").read_text())
    click.echo(f"report: {out}/multi_gpu.md ({len(rows)} layouts)")


@cli.command("cluster-faults")
@click.option("--model", default="digits_cnn", show_default=True)
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="grpc", show_default=True)
@click.option("--users", type=int, default=4, show_default=True)
@click.option("--seconds", type=int, default=40, show_default=True, help="Locust run time per experiment.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@options.STATE_DIR
@user_errors
def cluster_faults(model, protocol, users, seconds, out, state_dir):
    """Locust through Envoy while a replica is SIGKILLed, while a model's stub is, then during a rolling restart
    (after `make cluster`)."""
    from loadtest.benches.cluster_faults import run
    from server.cluster import read_cluster

    read_cluster(state_dir)
    out = out or Path("reports") / time.strftime("cluster-faults-%Y%m%d-%H%M%S")
    run(state_dir, model, protocol, users, seconds, out)
    click.echo((out / "faults.md").read_text())


@cli.command()
@click.argument("run", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option(
    "--compare",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="An earlier run folder: show the change of each metric.",
)
@options.REPO
@click.option(
    "--prometheus",
    "prometheus_url",
    default=None,
    help="Prometheus URL for the server-side view (default: the one `make monitor` started in STATE_DIR).",
)
@options.STATE_DIR
@user_errors
def report(run, compare, repo, prometheus_url, state_dir):
    """(Re)build RUN/report.md and RUN/report.html from what the run folder holds."""

    from loadtest.monitoring.prometheus_server import STATE
    from loadtest.reporting.report import build_report

    if prometheus_url is None and (state_dir / STATE).exists():
        prometheus_url = json.loads((state_dir / STATE).read_text())["url"]
    click.echo(f"report: {build_report(run, repo if repo.exists() else None, compare, prometheus_url)}")


@cli.command("batching-bench")
@click.option("--models", default="digits_cnn resnet18", show_default=True)
@click.option("--concurrency", default="1 4 16", show_default=True)
@click.option("--max-queue-delay-us", type=int, default=1000, show_default=True)
@click.option("--interval-ms", type=int, default=2000, show_default=True)
@click.option("--gpu", is_flag=True, help="Serve with the torch runtime (fp16, CUDA graphs) on KIND_GPU instances.")
@click.option("--host-outputs", is_flag=True, help="GPU: return outputs from host memory instead of CUDA IPC.")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def batching_bench(models, concurrency, max_queue_delay_us, interval_ms, gpu, host_outputs, out):
    """Throughput and latency for {no batching, dynamic batching} x {1, 2 instances} x concurrency."""
    from loadtest.benches import batching_bench as bench

    out = out or Path("reports") / time.strftime("batching-%Y%m%d-%H%M%S")
    text = bench.run(models.split(), out, _numbers(concurrency), interval_ms, max_queue_delay_us, gpu, host_outputs)
    click.echo(text)
    click.echo(f"report: {out}/batching.md")


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
@click.option(
    "--instances",
    type=int,
    default=1,
    show_default=True,
    help="GPU instances per served variant (more than 1 shares one GPU between processes: docs/benchmarks.md).",
)
@click.option("--interval-ms", type=int, default=3000, show_default=True)
@click.option(
    "--max-batch",
    type=int,
    default=0,
    help="Max batch of the served models (default: --gpu-batch); the compiled rows measure every bucket up to it.",
)
@click.option(
    "--served",
    default="",
    help="Served rows only these (default: all): onnx fp32 graphs graphs_u8 inductor inductor_u8 "
    "inductor_u8_unstaged inductor_u8_inproc.",
)
@click.option("--profile", is_flag=True, help="Also time each step of single requests through execute.")
@click.option("--quick", is_flag=True, help="Compiled fp16 and served rows only (no CPU/eager rows, bf16, cold start).")
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def gpu_bench(
    model, gpu_batch, cpu_batch, served_points, instances, interval_ms, max_batch, served, profile, quick, out
):
    """CPU vs GPU vs TensorRT vs compiled engines for MODEL, in-process and served, in one run."""
    from loadtest.benches import gpu_bench as bench

    out = out or Path("reports") / time.strftime("gpu-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    points = tuple(tuple(int(v) for v in p.split("x")) for p in served_points.split())
    rows = bench.served_rows(served.replace(",", " ").split())
    settings = bench.BenchSettings(
        model, gpu_batch, cpu_batch, points, instances, interval_ms, max_batch, rows, profile, quick
    )
    bench.run(settings, out)
    click.echo((out / "gpu_bench.md").read_text())
    click.echo(f"report: {out}/gpu_bench.md (CSV: gpu_bench.csv, plot: gpu_bench.png)")


@cli.command("text-bench")
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(path_type=Path, exists=True),
    default=Path("examples/text/models.toml"),
    show_default=True,
)
@click.option("--model", default="minilm_l6_random", show_default=True, help="A sequence model of the spec file.")
@click.option(
    "--lengths",
    default="lognormal fixed:32",
    show_default=True,
    help="Workloads: 'lognormal[:MEDIAN]' and/or 'fixed:N'.",
)
@click.option("--sentences", type=int, default=0, help="Sentences per workload (default: 8192 on a GPU, 256 on a CPU).")
@click.option("--batch", type=int, default=256, show_default=True, help="In-process batch.")
@click.option("--per-request", type=int, default=32, show_default=True, help="Sentences per request (served).")
@click.option(
    "--concurrency", default="", help="Concurrency of the per-request points (default: 16 64 128 on a GPU, 4 on a CPU)."
)
@click.option(
    "--single-concurrency",
    default="",
    help="Concurrency of single-sentence points (default: 256 on a GPU, 16 on a CPU).",
)
@click.option("--interval-ms", type=int, default=3000, show_default=True)
@click.option("--precision", default="", help="fp32, fp16 or bf16 (default: fp16 on a GPU, fp32 on a CPU).")
@click.option(
    "--tokenizer", type=click.Path(path_type=Path, exists=True), default=None, help="tokenizer.json for the text rows."
)
@click.option(
    "--max-batch", type=int, default=0, help="The served model's max batch (default: 1024 on a GPU, the spec's)."
)
@click.option("--instances", type=int, default=0, help="Instances of the served engine (default: 1).")
@click.option("--no-before", is_flag=True, help="CPU: skip the rows of the model served as before ragged batching.")
@click.option(
    "--queue-delay-us",
    type=int,
    default=0,
    show_default=True,
    help="max_queue_delay of the served engine and the tokenize step (the CPU's ONNX rows use 500).",
)
@click.option(
    "--summaries-off-too",
    is_flag=True,
    help="Also measure the single-sentence and latency points on a server without Triton's latency summaries.",
)
@click.option(
    "--quantiles-too",
    default="",
    help="Also measure those points on a server whose summaries keep these quantiles ('q:error,...', e.g. "
    "tritonserver's own 0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001).",
)
@click.option(
    "--server-env-too",
    multiple=True,
    help="Also measure those points on a server started with this variable set, VAR=VALUE (repeatable: a server "
    "each), e.g. OMP_NUM_THREADS=4.",
)
@click.option(
    "--client-cores",
    type=click.IntRange(min=0),
    default=0,
    help="Single sentences also with the client on this many cores of its own and the server's threads on the "
    "rest, alternated with the shared way twice on the same server (a client on another machine); 0: off.",
)
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def text_bench(
    spec_file,
    model,
    lengths,
    sentences,
    batch,
    per_request,
    concurrency,
    single_concurrency,
    interval_ms,
    precision,
    tokenizer,
    max_batch,
    instances,
    no_before,
    queue_delay_us,
    summaries_off_too,
    quantiles_too,
    server_env_too,
    client_cores,
    out,
):
    """A text model in-process and served (ids and raw text), over length distributions, in one run."""
    from loadtest.benches import text_bench as bench

    out = out or Path("reports") / time.strftime("text-%Y%m%d-%H%M%S")
    settings = bench.TextBenchSettings(
        spec_file,
        model,
        tuple(lengths.split()),
        sentences,
        batch,
        per_request,
        _numbers(concurrency),
        _numbers(single_concurrency),
        interval_ms,
        precision,
        tokenizer,
        instances=instances,
        max_batch=max_batch,
        before=not no_before,
        queue_delay_us=queue_delay_us,
        summaries_off=summaries_off_too,
        quantiles_too=quantiles_too,
        server_env_too=bench.server_variables(server_env_too),
        client_cores=client_cores,
    )
    bench.run(settings, out)
    click.echo((out / "text_bench.md").read_text())
    click.echo(f"report: {out}/text_bench.md (CSV: text_bench.csv, plot: text_bench.png)")


@cli.command()
@click.option("--python", "python_version", default="3.12", show_default=True, help="Python of the target host.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Default: dist/triton-bundle-py<ver>.tar.xz")
@user_errors
def bundle(python_version, out):
    """Offline tarball for GPU hosts without internet: tritonserver, perf_analyzer, wheels."""
    from loadtest.bundle import make_bundle

    out = out or Path("dist") / f"triton-bundle-py{python_version.replace('.', '')}.tar.xz"
    path = make_bundle(out, python_version)
    click.echo(
        f"bundle: {path} ({path.stat().st_size / 2**20:.1f} MiB); on the host: tar -xJf {path.name} && "
        "sh triton-bundle/install.sh  (prints the environment to export)"
    )


if __name__ == "__main__":
    cli()
