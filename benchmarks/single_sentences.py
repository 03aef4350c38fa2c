"""Single sentences at one concurrency, in one server: the text bench's engine, a copy of it with two instances,
and its echo, taking turns (our closed-loop client over gRPC or HTTP, text-bench's lognormal lengths, summaries off).

The bench of record (`python -m tpserve.loadtest text-bench`) serves single sentences in a server that also holds the
text
pipeline, writes the runners' statistics every second, and is driven by a process that measured the engine
in-process first, and served requests of 32 sentences before. Each of those can be added here (--text, --stats,
--inprocess-first, --batches-first), so that what the bench of record's setting costs single sentences is a figure
of one run on one host.

    .venv/bin/python -m benchmarks.single_sentences --out reports/single_sentences [--concurrency 256] \
        [--rounds 3] [--text] [--stats] [--inprocess-first] [--batches-first] [--processes 8,16] \
        [--protocols grpc,http] [--against-plain]

--against-plain serves as `server start` does (the default front) with a plain server of the same repository
beside, and measures each point on both in alternated order round by round (the engine and its echo): what the
front keeps of a plain server's throughput, as medians of the rounds.

Writes single_sentences.md under --out.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import statistics
from pathlib import Path

TWIN = "_x2"  # the copy of the engine with two instances


def twin_of(repo: Path, engine: str) -> str:
    """A copy of the engine's model folder whose instance group counts two: returns its name."""
    twin = engine + TWIN
    shutil.copytree(repo / engine, repo / twin)
    config = (repo / twin / "config.pbtxt").read_text()
    config = config.replace(f'name: "{engine}"', f'name: "{twin}"', 1)
    config, found = re.subn(r"\bcount: 1\b", "count: 2", config, count=1)
    if not found:
        raise SystemExit(f"{engine}'s config has no instance count of 1 to double")
    (repo / twin / "config.pbtxt").write_text(config)
    return twin


def build(args, out: Path):
    """The engine and its echo as text-bench builds them (and its text pipeline with --text)."""
    import torch

    from tpserve.loadtest.benches import text_bench as tb

    gpu = torch.cuda.is_available()
    settings = tb.TextBenchSettings(text=args.text, lengths=("lognormal",), tokenizer=args.tokenizer)
    settings = tb.for_device(settings, gpu)
    spec, models = tb.build(settings, out / "work", out / "repo", gpu)
    if args.inprocess_first:
        workload = tb.tw.Lengths.parse("lognormal", longest=spec.longest_sequence())
        tb.inprocess(settings, spec, out / "work", gpu, [workload])
    names = {"engine": models["engine"]}
    if not args.against_plain:
        names["two instances"] = twin_of(out / "repo", models["engine"])
    names["echo"] = models["echo"]
    return spec, names, settings.concurrency[-1]


def batches_first(tb, ep, engine: str, lengths, concurrency: int) -> None:
    """The bench of record's order: requests of 32 sentences at its highest concurrency (128 on a GPU) first."""
    from tpserve.common.errors import MeasurementError

    point = tb.Point(path="served ids", model=engine, encoder=engine, per_request=32, concurrency=concurrency)
    try:
        print(
            f"32 sentences a request first, c{concurrency}: {tb._client_point(point, ep, lengths)['throughput']:,.0f}/s"
        )
    except MeasurementError as err:  # a slow host answers none in the window: the load was still sent
        print(f"32 sentences a request first, c{concurrency}: sent, not measured ({err})")


def measure(args, out: Path) -> dict[str, list[float]]:
    """Sentences/s per model, one figure a round, the models taking turns."""
    from tpserve.common.endpoints import PROTOCOLS
    from tpserve.loadtest.benches import text_bench as tb
    from tpserve.server.triton.launcher import TritonTuning, running

    spec, names, heavy = build(args, out)
    lengths = tb.tw.Lengths.parse("lognormal", longest=spec.longest_sequence()).sample(8192)
    stats = out / "ragged_stats" if args.stats else None
    if stats is not None:
        stats.mkdir(parents=True, exist_ok=True)
    tuning = TritonTuning(latency_summaries=False, args=tuple(args.server_args.split()))
    if args.against_plain:
        return against_plain(args, out, names, lengths, stats, tuning)
    got: dict[str, list[float]] = {}
    with running(out / "repo", out / "state", startup_timeout=900, tuning=tuning, ragged_stats=stats) as state:
        eps = {protocol: state.endpoint(protocol, out / "repo") for protocol in PROTOCOLS}
        for round_ in range(args.rounds):
            if args.batches_first and round_ == min(1, args.rounds - 1):  # a round before them, where two or more
                batches_first(tb, eps["grpc"], names["engine"], lengths, heavy)
            for (label, model), protocol, processes in itertools.product(names.items(), args.protocols, args.processes):
                point = tb.Point(
                    path="served ids", model=model, encoder=model, per_request=1, concurrency=args.c, protocol=protocol
                )
                result = tb._client_point(point, eps[protocol], lengths, processes)
                key = f"{label}, {protocol}" + (f", {processes} client processes" if processes else "")
                got.setdefault(key, []).append(result["throughput"])
                figures = f"{result['throughput']:,.0f}/s, p50 {result['p50_ms']:.2f} ms"
                print(f"round {round_ + 1} {key}: {figures}; {result['client']}", flush=True)
    return got


def against_plain(args, out: Path, names: dict, lengths, stats, tuning) -> dict[str, list[float]]:
    """Each point as served and on a plain server, the two in alternated order round by round; also the ratio."""
    from tpserve.common.endpoints import PROTOCOLS
    from tpserve.loadtest.benches import text_bench as tb
    from tpserve.server.fronts import served_as_started

    got: dict[str, list[float]] = {}
    serving = served_as_started(out / "repo", out / "state", startup_timeout=900, tuning=tuning, ragged_stats=stats)
    with serving as (state, plain):
        assert plain is not None  # direct=True: the plain server is started beside
        servers = {
            "as served": {p: state.endpoint(p, out / "repo") for p in PROTOCOLS},
            "plain": {p: plain.endpoint(p, out / "repo") for p in PROTOCOLS},
        }
        for round_ in range(args.rounds):
            order = ("as served", "plain") if round_ % 2 == 0 else ("plain", "as served")
            for (label, model), protocol in itertools.product(names.items(), args.protocols):
                point = tb.Point(
                    path="served ids", model=model, encoder=model, per_request=1, concurrency=args.c, protocol=protocol
                )
                figures = {}
                for server in order:
                    result = tb._client_point(point, servers[server][protocol], lengths)
                    figures[server] = result["throughput"]
                    got.setdefault(f"{label}, {protocol}, {server}", []).append(result["throughput"])
                    print(
                        f"round {round_ + 1} {label}, {protocol}, {server}: {result['throughput']:,.0f}/s, "
                        f"p50 {result['p50_ms']:.2f} ms; {result['client']}",
                        flush=True,
                    )
                got.setdefault(f"{label}, {protocol}, as served / plain", []).append(
                    figures["as served"] / figures["plain"]
                )
                (out / "single_sentences.md").write_text(report(args, got))  # a run cut short keeps its rounds
    return got


def report(args, got: dict[str, list[float]]) -> str:
    held = [name for name, on in (("text pipeline", args.text), ("runners' statistics", args.stats)) if on]
    if args.inprocess_first:
        held.append("in-process measurements first")
    if args.server_args:
        held.append(f"tritonserver {args.server_args} (both servers)")
    if args.batches_first:
        held.append("requests of 32 sentences at the bench's highest concurrency after round 1 (before it: one round)")
    title = "as served and on a plain server, alternated" if args.against_plain else "one server, taking turns"
    lines = [
        f"# Single sentences at concurrency {args.c}, {title}",
        "",
        f"Also held: {', '.join(held) or 'nothing else'}.",
        "",
        "| model | rounds (sentences/s) | median |",
        "|---|---|---:|",
    ]
    for label, figures in got.items():
        form = ",.3f" if label.endswith("/ plain") else ",.0f"
        rounds = ", ".join(format(f, form) for f in figures)
        lines.append(f"| {label} | {rounds} | {format(statistics.median(figures), form)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/single_sentences"))
    parser.add_argument("--concurrency", dest="c", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json (--text; default: the zoo's)")
    parser.add_argument("--text", action="store_true", help="the server also holds the text pipeline")
    parser.add_argument("--stats", action="store_true", help="the runners write their statistics every second")
    parser.add_argument("--inprocess-first", action="store_true", help="measure the engine in-process first")
    parser.add_argument(
        "--batches-first", action="store_true", help="32 sentences a request (c128 on a GPU) after round 1 of 2+"
    )
    parser.add_argument(
        "--processes",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[0],
        help="the client's processes, each a row (0: its own choice); e.g. 8,12,16",
    )
    parser.add_argument(
        "--protocols", type=lambda s: s.split(","), default=["grpc"], help="grpc, http or both (grpc,http)"
    )
    parser.add_argument(
        "--against-plain",
        action="store_true",
        help="as `server start` serves, a plain server beside, each point on both in alternated order",
    )
    parser.add_argument(
        "--server-args",
        default="",
        help="tritonserver tuning flags for both servers, given with =: --server-args=--http-thread-count=16",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text = report(args, measure(args, args.out))
    (args.out / "single_sentences.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
