"""Our instruments: the benches that answer the project's own questions (what recording costs, what Envoy costs,
whether Locust and perf_analyzer agree, batching and multi-GPU layouts). Not packaged; they import the product,
the product never imports them. `python -m benchmarks --help` lists them."""

import contextlib
import time
from pathlib import Path

import click

from tpserve.common import options
from tpserve.common.cli import numbers, private_files, user_errors, words


@click.group()
def cli():
    """Instruments of the project (not part of the product): `python -m benchmarks COMMAND --help`."""
    private_files()


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
    from benchmarks import reconcile as rec
    from tpserve.clients.connection import endpoint, parse_headers
    from tpserve.loadtest.locust_suite.run import Target
    from tpserve.loadtest.perf.run import served_or_given
    from tpserve.loadtest.perf.tools import find_perf_analyzer

    out = out or Path("reports") / time.strftime("reconcile-%Y%m%d-%H%M%S")
    ep, analyzer = endpoint(protocol, url, state_dir, parse_headers(headers)), find_perf_analyzer()
    state = Target.of(ep)
    names = served_or_given(words(models), ep).names
    results = [rec.reconcile(state, ep, analyzer, m, concurrency, seconds, out / m) for m in names]
    text = rec.markdown(results)
    (out / "reconcile.md").write_text(f"# Locust vs perf_analyzer\n\n{text}\n")
    click.echo(text)
    click.echo(f"report: {out}/reconcile.md")


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
    from benchmarks import envoy_bench as bench
    from tpserve.loadtest.perf.tools import find_perf_analyzer
    from tpserve.server.stack import read_stack

    read_stack(state_dir)  # a cluster runs there, or say how to start one
    out = out or Path("reports") / time.strftime("envoy-%Y%m%d-%H%M%S")
    rows = bench.measure(
        state_dir,
        model,
        protocols.split(),
        numbers(concurrency),
        find_perf_analyzer(),
        out,
        measurement_ms=interval_ms,
        stability_percent=50.0,
        max_trials=10,
    )
    click.echo(bench.write(bench.compare(rows), rows, out))
    click.echo(f"report: {out}/envoy.md")


@cli.command("edge-cost")
@click.option("--model", default="digits_cnn", show_default=True)
@click.option("--protocols", default="grpc http", show_default=True)
@click.option("--concurrency", default="1 4", show_default=True)
@click.option("--rounds", type=int, default=3, show_default=True, help="Alternated rounds; medians are reported.")
@click.option("--interval-ms", type=int, default=2000, show_default=True, help="perf_analyzer measurement window.")
@click.option("--ablation/--no-ablation", default=True, show_default=True, help="Also the stripped copies of the edge.")
@click.option("--host-label", default="this host", show_default=True, help="Names the host in the report.")
@click.option(
    "--in-server",
    type=click.Path(path_type=Path),
    default=None,
    help="The state folder of a second server of the same repository started with `start --no-edge "
    "--checks-in-server`: its HTTP and gRPC ports are targets too.",
)
@click.option(
    "--plain",
    type=click.Path(path_type=Path),
    default=None,
    help="With --in-server: the state folder of a third server started with `start --no-edge` (no checks), what "
    "the checks in the server are held to.",
)
@click.option(
    "--floors",
    "floor_values",
    nargs=2,
    type=float,
    default=(0.15, 0.8),
    show_default=True,
    help="The floors the report holds the edge to: ms added at concurrency 1, throughput kept above it (issue 65: "
    "0.15 0.8 on the 2-core host; 0.10 0.9 for single sentences on a GPU host).",
)
@click.option(
    "--input-data",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="perf_analyzer --input-data JSON (real payloads: one 32-token sentence, say); default: random data.",
)
@click.option("--out", type=click.Path(path_type=Path), default=None)
@options.STATE_DIR
@user_errors
def edge_cost(
    model,
    protocols,
    concurrency,
    rounds,
    interval_ms,
    ablation,
    host_label,
    in_server,
    plain,
    floor_values,
    input_data,
    out,
    state_dir,
):
    """The edge `make serve` puts in front against tritonserver's own port, and where its cost goes (copies of its
    Envoy stripped step by step), in alternated rounds (benchmarks/edge_cost.py)."""
    import json

    from benchmarks import edge_cost as bench
    from tpserve.loadtest.perf.tools import find_perf_analyzer
    from tpserve.server.edge.front import envoy_binary
    from tpserve.server.fronts import CHECKS_FILE

    config = state_dir / "envoy.json"
    envoy = config.exists() and (state_dir / "replica-0").is_dir()
    given = (in_server, plain)
    if not envoy:  # `make serve`'s default: the checks in the server are the target, held to a plain server
        if in_server is not None or not (state_dir / CHECKS_FILE).exists():
            raise click.ClickException(
                f"no server of `make serve` in {state_dir}: start one (`make serve`; `make serve FRONT=envoy` for "
                "Envoy and its ablation)"
            )
        in_server, ablation = state_dir, False
    out = out or Path("reports") / time.strftime("edge-cost-%Y%m%d-%H%M%S")
    served = json.loads(config.read_text()) if envoy else {}
    with contextlib.ExitStack() as stack:
        if in_server is not None and plain is None:  # the same repository with no front, while this runs
            plain = stack.enter_context(_plain_server(in_server, out / "plain_state"))
        copies: list = []
        for variant in bench.VARIANTS if ablation else ():  # each stopped however the run ends
            copies.append(stack.enter_context(_copy(bench, served, variant, out / "copies", envoy_binary())))
        rows = bench.measure(
            state_dir,
            model,
            protocols.split(),
            numbers(concurrency),
            rounds,
            find_perf_analyzer(),
            out,
            copies,
            in_server,
            plain,
            input_data=input_data,
            measurement_ms=interval_ms,
            stability_percent=50.0,
            max_trials=10,
        )
    header = (
        f"{host_label}, {time.strftime('%Y-%m-%d')}, {model}, {rounds} alternated rounds, medians; "
        f"`python -m benchmarks edge-cost --model {model} --rounds {rounds}"
        f"{' --in-server DIR' if given[0] else ''}{' --plain DIR2' if given[1] else ''}` against `make serve`"
        f"{'' if envoy else ' (the checks in the server)'}"
        f"{' FRONT=envoy and `start --front server` in DIR' if given[0] else ''}"
        f"{'' if given[1] or in_server is None else ', held to a plain server (`start --front none`) it started'}"
        f"{' (held to `start --front none` in DIR2, the same server without the checks)' if given[1] else ''}."
    )
    limits = {"added_ms_c1": floor_values[0], "ratio_c4": floor_values[1]}
    click.echo(bench.write(bench.compare(rows), rows, out, header, limits))
    click.echo(f"report: {out}/edge_cost.md")


@contextlib.contextmanager
def _copy(bench, served: dict, variant, work: Path, binary: Path):
    """One stripped copy of the edge's Envoy, stopped when the block ends."""
    running = bench.start_copy(served, variant, work, binary)
    try:
        yield running
    finally:
        bench.stop_copy(running)


@contextlib.contextmanager
def _plain_server(served: Path, state_dir: Path):
    """A server of the repository served from `served`, with no front and the defaults, on free ports."""
    from tpserve.common.endpoints import read_state
    from tpserve.server.triton import launcher

    with launcher.running(Path(read_state(served).repo), state_dir, startup_timeout=900):
        yield state_dir


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
    '5 a second edge like the first (the control: the noise alone) (e.g. "1 2 5"). Default: all.',
)
@click.option(
    "--together",
    is_flag=True,
    help="Start every setup's server once and alternate the points among them (no restarts between the points "
    "compared); default: each setup started and stopped round by round.",
)
@click.option("--out", type=click.Path(path_type=Path), default=None)
@user_errors
def record_bench(repo, models, protocols, concurrency, rounds, interval_ms, setups, together, out):
    """What RECORD=1 and RECORD=values cost: perf_analyzer through the edge, recording off and on, alternated."""
    from benchmarks import record_bench as bench
    from tpserve.builders.environment import host_info

    out = (out or Path("reports") / time.strftime("record-%Y%m%d-%H%M%S")).absolute()
    names = words(models)
    chosen = bench.chosen_setups(setups)
    rows = bench.measure(
        repo, names, chosen, protocols.split(), concurrency, rounds, out, interval_ms, together=together
    )
    header = (
        f"Models {', '.join(names)}, perf_analyzer concurrency {concurrency}, {interval_ms} ms windows, "
        f"{rounds} rounds alternated; command: `python -m benchmarks record-bench --repo {repo} --models "
        f'"{models}" --protocols "{protocols}" --rounds {rounds} --interval-ms {interval_ms}'
        + (f' --setups "{setups}"' if setups else "")
        + (" --together" if together else "")
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
    from benchmarks import record_bench as bench

    rows = bench.read_points(points)
    header = title or f"Pooled from {len(points)} run(s): {', '.join(str(p) for p in points)}."
    click.echo(bench.write(bench.compare(rows), rows, out.absolute(), header))
    click.echo(f"report: {out.absolute()}/record.md")


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
    from benchmarks.multi_gpu_bench import MultiGpuSettings, build, run

    settings = MultiGpuSettings(model, gpus, instances_per_gpu, batch, concurrency_per_gpu, envoy=envoy)
    if build_only:
        click.echo(f"built {build(settings, work)[1]} in {work}")
        return
    out = out or Path("reports") / time.strftime("multi-gpu-%Y%m%d-%H%M%S")
    rows = run(settings, work, out)
    click.echo((out / "multi_gpu.md").read_text())
    click.echo(f"report: {out}/multi_gpu.md ({len(rows)} layouts)")


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
    from benchmarks import batching_bench as bench

    out = out or Path("reports") / time.strftime("batching-%Y%m%d-%H%M%S")
    text = bench.run(models.split(), out, numbers(concurrency), interval_ms, max_queue_delay_us, gpu, host_outputs)
    click.echo(text)
    click.echo(f"report: {out}/batching.md")


if __name__ == "__main__":
    cli()
