"""What the edge costs a request, and where: perf_analyzer through the edge that `server start` (`make serve`) puts
in front of tritonserver, against tritonserver's own port, and through copies of the same Envoy stripped step by
step (an ablation), all in alternated rounds against the one server.

    make serve REPO=model_repository              # the default path: the edge in front
    .venv/bin/python -m benchmarks edge-cost --model digits_cnn

Targets, each measured over gRPC and HTTP at each concurrency, once a round, their order rotated every round:

- direct: tritonserver's own port (replica-0's; the guard inside it is on, as always)
- edge: the running edge, as served
- no checks: a copy of the edge's Envoy without its HTTP request checks (the checks' module) and its Lua (the gRPC
  error wording)
- no checks, no buffer: also without the buffer filter (the HTTP body cap, which holds a request until its last byte)
- router only: no filter but Envoy's router (no cancel notice, no recording, no size cap)
- plain: the router alone, without retries, health checks, outlier detection and circuit breakers
- plain, 1 worker: the same with one Envoy worker thread

The copies listen on free ports of 127.0.0.1 and are stopped at the end. They are instruments: a copy without
checks must never serve anyone.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpserve.common import endpoints
from tpserve.common.endpoints import Endpoint

ROUTER = "envoy.filters.http.router"
LUA = "envoy.filters.http.lua"
FLOORS = {"added_ms_c1": 0.15, "ratio_c4": 0.8}  # issue: the edge adds <= 0.15 ms at c1, keeps >= 0.8 at c4


@dataclass(frozen=True)
class Variant:
    """One copy of the edge's Envoy: which filters it keeps, whether it keeps the cluster's resilience, workers."""

    name: str
    keep_filter: Callable[[dict], bool] | None = None  # which filters stay; None: all
    plain_cluster: bool = False
    workers: int = 0  # 0: Envoy's default (one per core)


def _no_checks(f: dict) -> bool:
    from tpserve.server.edge.request_checks import CHECKS_FILTER

    lua = f["name"] == LUA or f["name"].startswith("edge.grpc_errors") or "lua" in f["name"]
    return not lua and f.get("typed_config", {}).get("filter_name") != CHECKS_FILTER


def _no_checks_no_buffer(f: dict) -> bool:
    return _no_checks(f) and f["name"] != "envoy.filters.http.buffer"


VARIANTS = (
    Variant("no checks", keep_filter=_no_checks),
    Variant("no checks, no buffer", keep_filter=_no_checks_no_buffer),
    Variant("router only", keep_filter=lambda f: f["name"] == ROUTER),
    Variant("plain", keep_filter=lambda f: f["name"] == ROUTER, plain_cluster=True),
    Variant("plain, 1 worker", keep_filter=lambda f: f["name"] == ROUTER, plain_cluster=True, workers=1),
)


@dataclass
class Copy:
    """A running copy: its variant, ports and process."""

    variant: Variant
    http_port: int
    grpc_port: int
    process: subprocess.Popen
    folder: Path

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"


def variant_config(served: dict, variant: Variant, http_port: int, grpc_port: int, admin: Path) -> dict:
    """The served Envoy configuration, stripped as the variant says, on new ports, with its own admin socket and
    no stats listener."""
    config = copy.deepcopy(served)
    config["admin"] = {"address": {"pipe": {"path": str(admin), "mode": 0o600}}}
    resources = config["static_resources"]
    resources["listeners"] = [
        listener for listener in resources["listeners"] if listener["name"] in ("triton_http", "triton_grpc")
    ]
    for listener in resources["listeners"]:
        port = http_port if listener["name"] == "triton_http" else grpc_port
        listener["address"]["socket_address"]["port_value"] = port
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        if variant.keep_filter is not None:
            manager["http_filters"] = [f for f in manager["http_filters"] if variant.keep_filter(f)]
            kept = {f["name"] for f in manager["http_filters"]}
            for host in manager["route_config"]["virtual_hosts"]:
                for route in host["routes"]:
                    per_filter = route.get("typed_per_filter_config", {})
                    for name in [n for n in per_filter if n not in kept]:
                        del per_filter[name]
        if variant.plain_cluster:
            for host in manager["route_config"]["virtual_hosts"]:
                for route in host["routes"]:
                    route.get("route", {}).pop("retry_policy", None)  # a refused stream: Envoy answers it
            manager.pop("access_log", None)
    resources["clusters"] = [c for c in resources["clusters"] if c["name"].startswith("replicas_")]
    if variant.plain_cluster:
        for cluster in resources["clusters"]:
            for key in ("health_checks", "outlier_detection", "circuit_breakers", "common_lb_config"):
                cluster.pop(key, None)
            for group in cluster["load_assignment"]["endpoints"]:
                for endpoint in group["lb_endpoints"]:
                    endpoint["endpoint"].pop("health_check_config", None)
        config.pop("overload_manager", None)
    return config


def start_copy(served: dict, variant: Variant, work: Path, binary: Path) -> Copy:
    """Start the variant's Envoy on two free ports; wait until both accept connections."""
    folder = work / variant.name.replace(" ", "_").replace(",", "")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    http_port, grpc_port = endpoints.free_ports(2)
    config = variant_config(served, variant, http_port, grpc_port, folder / "admin.sock")
    path = folder / "envoy.json"
    path.write_text(json.dumps(config, indent=2))
    command = [str(binary), "-c", str(path), "--log-level", "warn", "--disable-hot-restart"]
    command += ["--concurrency", str(variant.workers)] if variant.workers else []
    with open(folder / "envoy.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for port in (http_port, grpc_port):
        _wait_port(port, process, folder / "envoy.log")
    return Copy(variant, http_port, grpc_port, process, folder)


def _wait_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if process.poll() is not None:
            raise RuntimeError(f"a copy of the edge exited with code {process.returncode}: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"a copy of the edge did not listen on {port} within {timeout:g} s; see {log}")


def stop_copy(running: Copy) -> None:
    try:
        os.killpg(running.process.pid, signal.SIGTERM)
        running.process.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()


IN_SERVER = "checks in the server"  # `start`'s default front (`--front server`): the edge's checks in its reads
PLAIN = "plain server"  # `start --front none`: the same server without them, what the checks in the server are held to


def targets(
    state_dir: Path, protocol: str, copies: list[Copy], in_server: Path | None = None, plain: Path | None = None
) -> dict[str, Endpoint]:
    from tpserve.clients.connection import endpoint

    found = {}
    if (state_dir / "replica-0").is_dir():  # Envoy in front (`--front envoy`): its server's own port beside
        found = {
            "direct": endpoint(protocol, None, state_dir / "replica-0"),
            "edge": endpoint(protocol, None, state_dir),
        }
    if in_server is not None:  # HTTP checked in its reads; gRPC held by the guard on its public port
        found[IN_SERVER] = endpoint(protocol, None, in_server)
    if plain is not None:
        found[PLAIN] = endpoint(protocol, None, plain)
    for running in copies:
        found[running.variant.name] = dataclasses.replace(found["edge"], url=running.url(protocol))
    return found


def measure(
    state_dir, model, protocols, concurrency, rounds, analyzer, out: Path, copies, in_server=None, plain=None, **sweep
) -> list[dict]:
    """rounds × every target × protocol: one perf_analyzer sweep over the concurrency levels each; the targets'
    order rotated each round so that none always runs first. One row per point, with its round."""
    from tpserve.loadtest.perf.sweep import Sweep, run_sweep

    rows = []
    for round_ in range(1, rounds + 1):
        for protocol in protocols:
            found = list(targets(state_dir, protocol, copies, in_server, plain).items())
            shift = (round_ - 1) % len(found)
            for name, ep in found[shift:] + found[:shift]:
                points = Sweep(model, protocol=protocol, concurrency=tuple(concurrency), **sweep)
                raw = out / "raw" / f"round{round_}" / name.replace(" ", "_").replace(",", "")
                rows += [{**r, "target": name, "round": round_} for r in run_sweep(points, ep, analyzer, raw)]
    return rows


def compare(rows: list[dict]) -> list[dict]:
    """Per (protocol, concurrency, target): median throughput and p50 over the rounds, the ratio of the medians to
    direct's, the p50 added over direct's, and the rounds' spread of that ratio. The checks in the server are held
    to the plain server (the same kind of server without them) where it was measured, not to the edge's server."""
    table = []
    keys = sorted({(r["protocol"], int(r["level"])) for r in rows})
    names = list(dict.fromkeys(r["target"] for r in rows))
    for protocol, level in keys:
        of = {
            n: [r for r in rows if r["protocol"] == protocol and int(r["level"]) == level and r["target"] == n]
            for n in names
        }
        for name in names:
            points, base = of[name], of[_base(name, of)]
            if not points or not base:
                continue
            base_tp = statistics.median(r["throughput"] for r in base)
            base_p50 = statistics.median(r["p50_ms"] for r in base)
            by_round = {r["round"]: r for r in base}
            ratios = [p["throughput"] / by_round[p["round"]]["throughput"] for p in points if p["round"] in by_round]
            table.append(
                {
                    "protocol": protocol,
                    "concurrency": level,
                    "target": name,
                    "rounds": len(points),
                    "infer_s": round(statistics.median(p["throughput"] for p in points), 1),
                    "p50_ms": round(statistics.median(p["p50_ms"] for p in points), 3),
                    "ratio": round(statistics.median(p["throughput"] for p in points) / base_tp, 3),
                    "ratio_low": round(min(ratios), 3) if ratios else None,
                    "ratio_high": round(max(ratios), 3) if ratios else None,
                    "added_ms": round(statistics.median(p["p50_ms"] for p in points) - base_p50, 3),
                }
            )
    return table


def _base(name: str, of: dict) -> str:
    """What a target is held to: the checks in the server (and the plain server itself) to the plain server, the
    same kind of server without them, where it was measured; everything else to direct."""
    return PLAIN if name in (IN_SERVER, PLAIN) and of.get(PLAIN) else "direct"


def floors(table: list[dict], limits: dict | None = None) -> list[str]:
    """The issue's floors for the edge as served (and the checks in the server, where measured), met or missed, one
    line each."""
    limits = limits or FLOORS
    lines = []
    for t in (t for t in table if t["target"] in ("edge", IN_SERVER)):
        who = "the edge" if t["target"] == "edge" else "the checks in the server"
        adds, keeps = ("adds", "keeps") if t["target"] == "edge" else ("add", "keep")
        over = "the plain server" if t["target"] == IN_SERVER and any(x["target"] == PLAIN for x in table) else "direct"
        if t["concurrency"] == 1:
            ok = t["added_ms"] <= limits["added_ms_c1"]
            lines.append(
                f"{t['protocol']} c1: {who} {adds} {t['added_ms']:+.3f} ms (floor <= "
                f"{limits['added_ms_c1']} ms): {'met' if ok else 'missed'}"
            )
        elif t["concurrency"] >= 4:
            ok = t["ratio"] >= limits["ratio_c4"]
            lines.append(
                f"{t['protocol']} c{t['concurrency']}: {who} {keeps} {t['ratio']:.2f}x {over} (floor >= "
                f"{limits['ratio_c4']}): {'met' if ok else 'missed'}"
            )
    return lines


def write(table: list[dict], rows: list[dict], out: Path, header: str, limits: dict | None = None) -> str:
    """edge_cost.csv (medians), edge_cost_points.csv (every point), edge_cost.md and edge_cost.png."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("edge_cost.csv", table), ("edge_cost_points.csv", rows)):
        if data:
            with open(out / name, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=list(data[0]), extrasaction="ignore")
                writer.writeheader()
                writer.writerows(data)
    lines = [
        "| protocol | concurrency | target | infer/s | x its base (rounds' range) | p50 ms | added at p50 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {t['protocol']} | {t['concurrency']} | {t['target']} | {t['infer_s']:,.1f} | {t['ratio']:.3f} "
        f"({t['ratio_low']:.2f}-{t['ratio_high']:.2f}) | {t['p50_ms']:.3f} | {t['added_ms']:+.3f} ms |"
        for t in table
    ]
    if any(t["target"] == PLAIN for t in table) and any(t["target"] == "direct" for t in table):
        lines.append(
            f"\n*{IN_SERVER}* is held to the *{PLAIN}* (`start --front none`: the same kind of server without the "
            "checks), not to *direct* (tritonserver's own port behind Envoy, another server): its ratio and added "
            "p50 are over the plain server's."
        )
    text = "\n".join(lines) + "\n\nFloors:\n\n" + "\n".join(f"- {f}" for f in floors(table, limits))
    (out / "edge_cost.md").write_text(
        f"# What the edge costs, and where\n\n{header}\n\n{text}\n\n![added latency and throughput](edge_cost.png)\n"
    )
    _plot(table, out / "edge_cost.png", limits)
    return text


def _plot(table: list[dict], path: Path, limits: dict | None = None) -> Path:
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(dict.fromkeys(t["target"] for t in table if t["target"] != "direct"))
    groups = sorted({(t["protocol"], t["concurrency"]) for t in table})
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        c1 = [
            next((t["added_ms"] for t in table if (t["protocol"], t["concurrency"], t["target"]) == (p, c, name)), 0)
            for p, c in groups
            if c == 1
        ]
        high = [
            next((t["ratio"] for t in table if (t["protocol"], t["concurrency"], t["target"]) == (p, c, name)), 0)
            for p, c in groups
            if c != 1
        ]
        left.bar([x + i * width for x in range(len(c1))], c1, width, label=name)
        right.bar([x + i * width for x in range(len(high))], high, width, label=name)
    left.set_xticks(
        [x + 0.4 - width / 2 for x in range(len([g for g in groups if g[1] == 1]))],
        [f"{p} c1" for p, c in groups if c == 1],
    )
    right.set_xticks(
        [x + 0.4 - width / 2 for x in range(len([g for g in groups if g[1] != 1]))],
        [f"{p} c{c}" for p, c in groups if c != 1],
    )
    limits = limits or FLOORS
    left.axhline(limits["added_ms_c1"], color="black", linestyle="--", linewidth=1, label="floor")
    right.axhline(limits["ratio_c4"], color="black", linestyle="--", linewidth=1, label="floor")
    left.set_ylabel("ms added at p50 over tritonserver's own port")
    right.set_ylabel("throughput, times direct")
    left.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)
