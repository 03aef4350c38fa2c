"""Measurement commands: `python -m tpserve.loadtest perf|install-perf-analyzer`."""

import json
import sys
import time
from pathlib import Path

import click

from tpserve.common import options
from tpserve.common.cli import clean_exit_on_sigterm, numbers, private_files, user_errors, words
from tpserve.common.errors import MeasurementError


@click.group()
def cli():
    """Measure a running Triton server: perf_analyzer sweeps, reports."""
    private_files()
    clean_exit_on_sigterm()  # the benches start servers: stopped, not left running, when the bench is stopped


def _failure_reasons(path: Path, most: int = 5) -> str:
    """Locust's failures grouped by reason, the most frequent first: "  <count> x <reason>" lines."""
    import csv

    if not path.exists():
        return ""
    with open(path, newline="") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda r: -int(r.get("Occurrences") or 0))
    return "\n".join(f"  {r['Occurrences']} x {r['Name']}: {r['Error'][:300]}" for r in rows[:most])


def generator_option(default: str):
    """--generator, one option for every command that replays: its choices are the replay's generators."""
    from tpserve.loadtest.locust_suite import GENERATORS

    return click.option(
        "--generator",
        type=click.Choice(GENERATORS),
        default=default,
        show_default=True,
        help="The replay's load generator: locust (one process), or fast (requests serialized once, sent by worker "
        "processes: GPU rates).",
    )


@cli.command("install-perf-analyzer")
@user_errors
def install_perf_analyzer():
    """Install a perf_analyzer that runs on this host (idempotent)."""
    from tpserve.loadtest.perf.tools import install_perf_analyzer as install

    click.echo(f"perf_analyzer: {install().binary}")


@cli.command("install-prometheus")
@user_errors
def install_prometheus():
    """Unpack Debian's Prometheus into .tools/prometheus (no root, no service; idempotent)."""
    from tpserve.loadtest.monitoring.prometheus_tools import install_prometheus as install

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
@options.ADMIN_KEY_FILE
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
    admin_key_file,
    shapes,
    input_data,
    lengths,
    tls,
    ca_file,
    state_dir,
):
    """Sweep MODELS with perf_analyzer; write perf.csv, perf.md and a PNG plot; print the table."""
    from tpserve.clients.connection import endpoint, parse_headers
    from tpserve.clients.model_plan import parse_shapes
    from tpserve.loadtest.perf.run import PerfRequest, run

    ep = endpoint(protocol, url, state_dir, parse_headers(headers), tls, ca_file, admin_key_file)
    request = PerfRequest(
        models=words(models),
        protocol=protocol,
        concurrency=numbers(concurrency),
        request_rate=numbers(request_rate, float),
        batches=numbers(batch),
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
    from tpserve.clients.connection import endpoint, parse_headers
    from tpserve.clients.model_plan import parse_shapes
    from tpserve.loadtest.locust_suite.run import LocustRun, load_test, weighted

    ep = endpoint(protocol, url, state_dir, parse_headers(headers), tls, ca_file)
    run = LocustRun(
        models=weighted(words(models)),
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
    if not result.slo_ok:
        raise SystemExit("SLO breached: see the log")
    if result.exit_code:
        reasons = _failure_reasons(report.parent / "locust_failures.csv")
        raise SystemExit(
            "some requests failed" + (f", by what the server answered:\n{reasons}" if reasons else ": see the log")
        )


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
@click.option(
    "--concurrency",
    default="1 8",
    show_default=True,
    help="Concurrency levels swept per candidate (the best within the latency budget counts).",
)
@click.option(
    "--repeats",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Sweeps per candidate: medians, and the range that says which candidates the noise cannot tell apart.",
)
@click.option(
    "--resume/--fresh",
    default=True,
    show_default=True,
    help="Reuse what OUT's checkpoint measured with the same settings.",
)
@click.option(
    "--reanalyse",
    is_flag=True,
    help="Judge OUT's checkpoint again under --p99-ms and --accuracy-budget, without a server (seconds).",
)
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
    repeats,
    resume,
    reanalyse,
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
    from tpserve.clients.model_plan import parse_shapes
    from tpserve.loadtest import search as s

    budgets = {"p99_ms": p99_ms, "accuracy": accuracy_budget}
    if reanalyse:
        if out is None:
            raise click.UsageError("--reanalyse reads the checkpoint of a search's --out folder: name it")
        click.echo(s.reanalyse(out, repo, budgets))
        click.echo(f"report: {out}/search.md")
        return
    out = out or Path("reports") / time.strftime("search-%Y%m%d-%H%M%S")
    measure = {"concurrency": numbers(concurrency), "interval_ms": interval_ms, "repeats": repeats}
    measure.update(shapes=parse_shapes(shapes), input_data=input_data)
    if replayed is not None:
        measure["replay"] = s.replay_workload(replayed, speed, replay_seconds, replay_model or words(variants)[:1])
    request = s.SearchRun(
        repo=repo,
        out=out,
        variants=tuple(variants.split()),
        mode=mode,
        budgets=budgets,
        measure=measure,
        max_instances=max_instances,
        delays_us=numbers(delays_us),
        write_back=write_back,
        resume=resume,
    )
    click.echo(s.run(request))
    click.echo(f"report: {out}/search.md")


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
    from tpserve.clients.connection import endpoint, parse_headers
    from tpserve.loadtest.benches.soak import SoakSettings, run, served_processes

    names = tuple(protocols.split())
    if url and len(names) != 1:
        raise MeasurementError("--url is one port: give the one protocol it speaks (--protocols http or grpc)")
    settings = SoakSettings(
        model=model,
        seconds=minutes * 60,
        interval=interval,
        clients=clients,
        protocols=names,
        warmup=warmup,
        max_growth_pct=max_growth,
    )
    out = out or Path("reports") / time.strftime("soak-%Y%m%d-%H%M%S")
    endpoints = [endpoint(p, url, state_dir, parse_headers(headers)) for p in names]
    # tritonserver, its stubs, the supervisor and Envoy, as the state folder names them; a server not ours: none
    sampled = (lambda: None) if url else (lambda: served_processes(state_dir))
    summary = run(settings, endpoints, sampled, out)
    click.echo((out / "soak.md").read_text())
    click.echo(f"report: {out}/soak.md")
    sys.exit(0 if summary["goal_met"] else 1)


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
    help="A fitted workload file (python -m tpserve.loadtest fit-workload) instead of a recording.",
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
@click.option(
    "--connections", type=int, default=64, show_default=True, help="HTTP connections at most (fast: a process)."
)
@generator_option("locust")
@click.option("--processes", type=int, default=0, help="The fast generator's processes (default: for the rate).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/<time>).")
@options.URL
@options.HEADER
@options.TLS
@options.CA_FILE
@options.STATE_DIR
@user_errors
def replay(
    recording,
    speed,
    workload,
    scale,
    seed,
    protocol,
    models,
    connections,
    generator,
    processes,
    out,
    url,
    headers,
    tls,
    ca_file,
    state_dir,
):
    """Replay a recording open loop through Locust, or the fast generator (arrival times, models, protocols,
    shapes) against the server of `make serve` or any Triton (--url with --protocol); report recorded and
    replayed side by side."""
    from tpserve.clients.connection import endpoint, parse_headers
    from tpserve.loadtest.locust_suite.replay import Replay, run_replay
    from tpserve.loadtest.reporting.replay_report import summarize, write_report

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
        models=tuple(words(models)),
        headers=parse_headers(headers),
        tls=tls,
        ca_file=ca_file or "",
        connections=connections,
        generator=generator,
        processes=processes,
    )
    out = out or Path("reports") / time.strftime("replay-%Y%m%d-%H%M%S")
    result = run_replay(given, eps["http"].url, eps["grpc"].url, eps["http"].repo, out)
    summary = summarize(result, speed if workload is None else 1.0)
    where = url or f"{eps['http'].url} (http), {eps['grpc'].url} (grpc)"
    given = f"--from {recording} --speed {speed:g}" if workload is None else f"--workload {workload} --scale {scale:g}"
    header = (
        f"{'Recording' if workload is None else 'Workload'} {recording or workload}, against {where}; "
        f"protocol: {protocol or 'as recorded'}. Command: `python -m tpserve.loadtest replay {given}`"
    )
    _show_report(write_report(summary, out, header))


@cli.command()
@click.option(
    "--from", "recording", type=click.Path(path_type=Path), required=True, help="A recording (make serve RECORD=1)."
)
@click.option("--slo-p99-ms", type=float, required=True, help="The p99 latency to hold, in ms.")
@click.option("--growth", type=float, default=1.0, show_default=True, help="Times the recorded rate to plan for.")
@options.REPO
@click.option(
    "--models", default="", help="Whose recorded traffic to replay (default: every one the repository serves)."
)
@click.option(
    "--max-replicas",
    type=int,
    default=0,
    help="Most replicas to try (default: one per GPU where there is one, else up to 4 within the cores).",
)
@click.option("--instances", default="1 2", show_default=True, help="Instances per model to try.")
@click.option(
    "--delays-us", default="0 1000 5000", show_default=True, help="Batching delays tried one size below the choice."
)
@click.option(
    "--probe-seconds",
    type=float,
    default=0.0,
    help="A probe's length in replay seconds (default: a fifth of the replay, at least 2).",
)
@click.option(
    "--headroom",
    type=float,
    default=1.5,
    show_default=True,
    help="The choice is also probed at this many times GROWTH.",
)
@generator_option("fast")
@click.option("--processes", type=int, default=0, help="The fast generator's processes (default: for the rate).")
@click.option(
    "--max-waiting",
    type=int,
    default=0,
    help="Requests that may wait on a replica before the edge refuses, as MAX_WAITING= (default: as serve sets it).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Report folder (default reports/plan-<time>)."
)
@user_errors
def plan(
    recording,
    slo_p99_ms,
    growth,
    repo,
    models,
    max_replicas,
    instances,
    delays_us,
    probe_seconds,
    headroom,
    generator,
    processes,
    max_waiting,
    out,
):
    """The smallest deployment of this host (replicas, instances, batching delay) that serves GROWTH times the
    recorded traffic at p99 <= SLO with no failed request, found by replaying the recording open loop, proven by a
    closing replay, extrapolated to replicas and GPUs beyond this host; a report folder (md, HTML, PNG, JSON)."""
    from tpserve.loadtest.planning import report
    from tpserve.loadtest.planning.plan import PlanRequest, make_plan

    out = out or Path("reports") / time.strftime("plan-%Y%m%d-%H%M%S")
    request = PlanRequest(
        recording=recording,
        repo=Path(repo),
        slo_p99_ms=slo_p99_ms,
        growth=growth,
        out=out,
        models=tuple(words(models)),
        max_replicas=max_replicas,
        instances=numbers(instances),
        delays_us=numbers(delays_us),
        probe_seconds=probe_seconds,
        headroom=headroom,
        generator=generator,
        processes=processes,
        max_waiting=max_waiting,
    )
    command = f"python -m tpserve.loadtest plan --from {recording} --slo-p99-ms {slo_p99_ms:g} --growth {growth:g}"
    command += f" --generator {generator}" if generator != "fast" else ""
    command += f" --max-waiting {max_waiting}" if max_waiting else ""
    _show_report(report.write(make_plan(request), command))


@cli.command("install-model-analyzer")
@user_errors
def install_model_analyzer():
    """NVIDIA Model Analyzer in an environment of its own, .tools/model-analyzer (no root)."""
    from tpserve.loadtest import model_analyzer

    click.echo(f"model-analyzer: {model_analyzer.install()}")


@cli.command("model-analyzer")
@options.REPO
@click.option("--models", required=True, help="The models to profile ('a b').")
@click.option("--max-concurrency", type=int, default=8, show_default=True)
@click.option("--max-instance-count", type=int, default=2, show_default=True)
@click.option("--max-model-batch-size", type=int, default=16, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Folder (default reports/ma-<time>).")
@user_errors
def model_analyzer_profile(repo, models, max_concurrency, max_instance_count, max_model_batch_size, out):
    """Model Analyzer's profile of REPO's models, in its local launch mode on this checkout's tritonserver
    (bin/tritonserver) and perf_analyzer (bin/perf_analyzer); its reports and checkpoint in OUT."""
    from tpserve.loadtest import model_analyzer

    out = out or Path("reports") / time.strftime("ma-%Y%m%d-%H%M%S")
    search = {
        "max_concurrency": max_concurrency,
        "max_instance_count": max_instance_count,
        "max_model_batch_size": max_model_batch_size,
    }
    export = model_analyzer.profile(Path(repo), tuple(words(models)), out, search)
    click.echo(f"Model Analyzer: results {export}/results, reports {export}/reports")


@cli.command(
    "perf-analyzer", context_settings={"ignore_unknown_options": True, "help_option_names": []}, add_help_option=False
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@user_errors
def perf_analyzer(args):
    """perf_analyzer with every argument given and its libraries found (bin/perf_analyzer: Model Analyzer's
    --perf-analyzer-path)."""
    from tpserve.loadtest.perf.tools import exec_perf_analyzer

    exec_perf_analyzer(list(args))


@cli.command("fit-workload")
@click.option("--from", "recording", type=click.Path(path_type=Path), required=True, help="A recording.")
@click.option("--bin-seconds", type=float, default=10.0, show_default=True, help="The rate's time resolution.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("workload.json"), show_default=True)
@user_errors
def fit_workload(recording, bin_seconds, out):
    """A workload file from a recording: per model, the rate over time, its burstiness, protocols, shapes (no data)."""
    from tpserve.common.traffic import read_recording
    from tpserve.loadtest.workloads.fitted import fit, write_workload

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
    from tpserve.common.traffic import read_recording
    from tpserve.loadtest.reporting.replay_report import compare_recordings as compare
    from tpserve.loadtest.reporting.replay_report import write_comparison

    found = compare(list(read_recording(recorded)), list(read_recording(replayed, replayed=True)), speed)
    out = out or Path("reports") / time.strftime("recordings-%Y%m%d-%H%M%S")
    header = (
        f"Recorded: {recorded}; replayed at speed {speed:g}, recorded again by the server: {replayed}. Command: "
        f"`python -m tpserve.loadtest compare-recordings --recorded {recorded} --replayed {replayed} --speed {speed:g}`"
    )
    _show_report(write_comparison(found, out, header))


def _show_report(path: Path) -> None:
    """A markdown report's text up to its plot, then where it is."""
    click.echo(path.read_text().split("\n\n![")[0])
    click.echo(f"report: {path}")


@cli.command("kubernetes-monitoring")
@click.option("--folder", type=click.Path(path_type=Path, file_okay=False), default=Path("kubernetes"))
def kubernetes_monitoring(folder):
    """(Re)write the PrometheusRule and prometheus-adapter manifests from loadtest/monitoring/prometheus_rules.py."""
    from tpserve.loadtest.monitoring.kubernetes import write_kubernetes

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
    from tpserve.loadtest.monitoring import prometheus_server as prom

    if action == "stop":
        click.echo("prometheus stopped" if prom.stop(state_dir) else "no prometheus was running")
        return
    from tpserve.server.triton.launcher import check_port_free

    check_port_free("127.0.0.1", "prometheus", port)
    state = prom.start(state_dir, port, interval)
    click.echo(f"prometheus: {state['url']} (config and rules in {state['folder']})")


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
    from tpserve.loadtest.benches.cluster_faults import run
    from tpserve.server.stack import read_stack

    read_stack(state_dir)
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

    from tpserve.loadtest.monitoring.prometheus_server import STATE
    from tpserve.loadtest.reporting.report import build_report

    if prometheus_url is None and (state_dir / STATE).exists():
        prometheus_url = json.loads((state_dir / STATE).read_text())["url"]
    click.echo(f"report: {build_report(run, repo if repo.exists() else None, compare, prometheus_url)}")


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
@click.option("--quick", is_flag=True, help="Compiled fp16 and served rows only (no CPU/eager rows, bf16, cold start).")
@click.option(
    "--direct/--no-direct",
    default=True,
    show_default=True,
    help="Each served row also on a plain server (no front), beside the figure served as `server start` serves "
    "(always measured).",
)
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def gpu_bench(
    model, gpu_batch, cpu_batch, served_points, instances, interval_ms, max_batch, served, quick, direct, out
):
    """CPU vs GPU vs TensorRT vs compiled engines for MODEL, in-process and served, in one run."""
    from tpserve.loadtest.benches import gpu_bench as bench

    out = out or Path("reports") / time.strftime("gpu-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    points = tuple(tuple(int(v) for v in p.split("x")) for p in served_points.split())
    rows = bench.served_rows(served.replace(",", " ").split())
    settings = bench.BenchSettings(
        model=model,
        gpu_batch=gpu_batch,
        cpu_batch=cpu_batch,
        served_points=points,
        instances=instances,
        measurement_ms=interval_ms,
        max_batch=max_batch,
        served=rows,
        quick=quick,
        direct=direct,
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
    "--python-path-too",
    is_flag=True,
    help="GPU: serve the same engine through Python's per-batch path (native_path 0) beside, measured at the "
    "32-token latency point and the first single-sentence concurrency.",
)
@click.option(
    "--queue-delay-us",
    type=int,
    default=0,
    show_default=True,
    help="max_queue_delay of the served engine and the tokenize step (the CPU's ONNX rows use 500).",
)
@click.option(
    "--latency-summaries/--no-latency-summaries",
    default=True,
    show_default=True,
    help="Triton's p50/p90/p99 summaries per model (off: the p99 the alert rules read is the in-process backend's "
    "own histogram).",
)
@click.option(
    "--direct/--no-direct",
    default=True,
    show_default=True,
    help="Each served point also on a plain server (no front), beside the figure served as `server start` "
    "serves (always measured).",
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
    python_path_too,
    queue_delay_us,
    latency_summaries,
    direct,
    out,
):
    """A text model in-process and served (ids and raw text), over length distributions, in one run."""
    from tpserve.loadtest.benches import text_bench as bench

    out = out or Path("reports") / time.strftime("text-%Y%m%d-%H%M%S")
    settings = bench.TextBenchSettings(
        spec_file=spec_file,
        model=model,
        lengths=tuple(lengths.split()),
        sentences=sentences,
        batch=batch,
        per_request=per_request,
        concurrency=numbers(concurrency),
        single_concurrency=numbers(single_concurrency),
        interval_ms=interval_ms,
        precision=precision,
        tokenizer=tokenizer,
        instances=instances,
        max_batch=max_batch,
        before=not no_before,
        python_too=python_path_too,
        queue_delay_us=queue_delay_us,
        latency_summaries=latency_summaries,
        direct=direct,
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
    from tpserve.loadtest.bundle import make_bundle

    out = out or Path("dist") / f"triton-bundle-py{python_version.replace('.', '')}.tar.xz"
    parts = make_bundle(out, python_version)
    sizes = ", ".join(f"{p} ({p.stat().st_size / 2**20:.1f} MiB)" for p in parts)
    unpack = " && ".join(f"tar -xJf {p.name}" for p in parts)
    click.echo(
        f"bundle: {sizes}; on the host: {unpack} && sh triton-bundle/install.sh  (prints the environment to export)"
    )


if __name__ == "__main__":
    cli()
