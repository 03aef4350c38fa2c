"""Every GPU of a host: one GPU vs one server with instances on each GPU vs one replica per GPU.

ResNet-50 as the compiled engine (torch.compile inductor fp16, CUDA graphs, uint8 input), requests
at the max batch over gRPC with CUDA shared memory (one perf_analyzer per server, concurrency 4 per
GPU it serves), side by side in one run. Layouts:
    1 GPU                 one server, instance_group gpus [0]
    1 server, N GPUs      one server, instance_group gpus [0], gpus [1], ...
    N replicas            one server per GPU, each with instance_group gpus [i]
Scaling = layout throughput / the 1-GPU throughput.
"""

from __future__ import annotations

import csv
import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from tpserve.common import endpoints
from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError


@dataclass(frozen=True, kw_only=True)
class MultiGpuSettings:
    model: str = "resnet50"
    gpus: int = 2
    instances_per_gpu: int = 2
    batch: int = 512
    concurrency_per_gpu: int = 4
    measurement_ms: int = 4000
    envoy: bool = False  # also: replicas behind Envoy vs direct, without shared memory (the wire path)
    wire_batch: int = 128
    wire_concurrency_per_gpu: int = 8


def build(settings: MultiGpuSettings, work: Path) -> tuple[Path, str]:
    """Build the compiled uint8 variant (KIND_GPU, no batcher: requests come at the max batch); (repo, name)."""
    from tpserve.builders.build import build_model, build_torch_variant
    from tpserve.builders.repository.writer import ServingOptions, TorchRuntime
    from tpserve.builders.request import BuildRequest
    from tpserve.builders.spec import zoo

    spec = zoo.get_spec(settings.model, max_batch_size=settings.batch)
    repo, done = work / "repo", work / "built.json"
    if done.exists():  # built by an earlier call (--build-only): the compile takes minutes
        return repo, json.loads(done.read_text())["name"]
    build_model(
        BuildRequest(
            spec=spec, target="embedded", repo=work / "scratch_repo", work_dir=work / "build", options=ServingOptions()
        )
    )
    gpu = ServingOptions(instances=1, kind="KIND_GPU", dynamic_batching=False)
    runtime = TorchRuntime(
        precision="fp16", channels_last=True, cuda_graphs=True, compiler="inductor", uint8_input=True, host_outputs=True
    )
    name = build_torch_variant(
        BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=work / "build", options=gpu), runtime
    )["name"]
    done.write_text(json.dumps({"name": name}))
    return repo, name


def placed(repo: Path, model: str, gpus: list[int], count: int, target: Path) -> Path:
    """A repository holding only `model`, its instances placed `count` per GPU of `gpus`."""
    from tritonclient.grpc import model_config_pb2 as pb

    from tpserve.builders.repository.model_config import parse_pbtxt, proto_to_pbtxt

    shutil.rmtree(target, ignore_errors=True)  # a layout of an earlier run
    shutil.copytree(repo / model, target / model)
    config = parse_pbtxt((target / model / "config.pbtxt").read_text())
    del config.instance_group[:]
    for gpu in gpus:
        config.instance_group.add(count=count, kind=pb.ModelInstanceGroup.KIND_GPU, gpus=[gpu])
    (target / model / "config.pbtxt").write_text(proto_to_pbtxt(config))
    manifest = json.loads((repo / "manifest.json").read_text())
    manifest["models"] = {model: manifest["models"][model]}
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def layouts(repo: Path, model: str, s: MultiGpuSettings, work: Path) -> dict[str, list[tuple[Path, int]]]:
    """Layout name -> [(repository of one server, GPUs it serves)]."""
    every = list(range(s.gpus))
    return {
        "1 GPU": [(placed(repo, model, [0], s.instances_per_gpu, work / "one_gpu"), 1)],
        f"1 server, {s.gpus} GPUs": [(placed(repo, model, every, s.instances_per_gpu, work / "one_server"), s.gpus)],
        f"{s.gpus} replicas, 1 GPU each": [
            (placed(repo, model, [g], s.instances_per_gpu, work / f"replica_{g}"), 1) for g in every
        ],
    }


def measure_layout(name: str, servers: list[tuple[Path, int]], model: str, s: MultiGpuSettings, out: Path) -> dict:
    """Start the layout's servers, check an answer, load every server at once, stop; one row."""
    import contextlib

    from tpserve.loadtest.benches.gpu_bench import check_outputs
    from tpserve.server.triton.launcher import running

    started_eps: list = []
    with contextlib.ExitStack() as started:
        for repo, clients in servers:
            state = started.enter_context(running(repo, repo / "state", startup_timeout=600))
            ep = state.endpoint("grpc", repo)
            check_outputs(ep, model)
            started_eps.append((ep, clients))  # clients: the GPUs this server serves
        return _row(name, started_eps, model, s, out)


def _row(name: str, servers: list, model: str, s: MultiGpuSettings, out: Path, wire: bool = False) -> dict:
    """Load the servers at once; the layout's row: total and per-client img/s, the worst client's p50."""
    slug = "".join(c if c.isalnum() else "_" for c in name)
    points = _concurrent_perf(servers, model, s, out / "raw" / slug, wire)
    total = sum(p["throughput"] for p in points)
    step(f"{name}: {total:,.0f} img/s from {len(points)} perf_analyzer client(s)")
    return {
        "layout": name,
        "img_per_s": round(total, 1),
        "clients": len(points),
        "per_client": [round(p["throughput"], 1) for p in points],
        "p50_ms": max(p["p50_ms"] for p in points),
    }


def _concurrent_perf(servers: list, model: str, s: MultiGpuSettings, raw: Path, wire: bool = False) -> list[dict]:
    """One perf_analyzer per server, all at once, with concurrency_per_gpu x the GPUs it serves
    (shared-memory region names are per server: two clients of one server would collide)."""
    from tpserve.loadtest.perf.sweep import Sweep, run_sweep
    from tpserve.loadtest.perf.tools import find_perf_analyzer

    analyzer, results, errors = find_perf_analyzer(), {}, []

    batch, concurrency = (s.wire_batch, s.wire_concurrency_per_gpu) if wire else (s.batch, s.concurrency_per_gpu)

    def one(index, ep, gpus):
        sweep = Sweep(
            model,
            concurrency=(concurrency * gpus,),
            batch_sizes=(batch,),
            shared_memory="none" if wire else "cuda",
            measurement_ms=s.measurement_ms,
            max_trials=10,
            stability_percent=50,
            output_shm_bytes=batch * 1000 * 4,
        )
        try:
            results[index] = run_sweep(sweep, ep, analyzer, raw / f"client_{index}")[0]
        except Exception as err:  # reported after every client finished
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i, ep, gpus)) for i, (ep, gpus) in enumerate(servers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise MeasurementError(f"a perf_analyzer client failed: {errors[0]}")
    return [results[i] for i in sorted(results)]


def envoy_rows(repo: Path, model: str, s: MultiGpuSettings, work: Path, out: Path) -> list[dict]:
    """`make cluster` with one replica per GPU: one client per replica directly vs as many clients through
    Envoy (each its own connection: Envoy serves a connection on one worker), over the wire (gRPC without
    shared memory: a proxy carries the tensors), side by side."""
    from tpserve.clients.connection import endpoint
    from tpserve.loadtest.benches.gpu_bench import check_outputs
    from tpserve.server.cluster import ClusterSettings, start_cluster
    from tpserve.server.stack import stop_stack

    target = placed(repo, model, [0], s.instances_per_gpu, work / "cluster_repo")
    http, grpc, stats = endpoints.free_ports(3)
    settings = ClusterSettings(
        target,
        replicas=s.gpus,
        http_port=http,
        grpc_port=grpc,
        admin_port=stats,
        state_dir=work / "cluster_state",
        startup_timeout=600,
        gpu_per_replica=True,
    )
    start_cluster(settings)
    try:
        front = endpoint("grpc", None, settings.state_dir)
        replicas = [endpoint("grpc", None, settings.state_dir / f"replica-{i}") for i in range(s.gpus)]
        check_outputs(front, model)
        layouts = {
            f"{s.gpus} replicas direct, gRPC without shm": [(ep, 1) for ep in replicas],
            f"{s.gpus} replicas behind Envoy, gRPC without shm": [(front, 1)] * s.gpus,
        }
        return [_row(name, servers, model, s, out, wire=True) for name, servers in layouts.items()]
    finally:
        stop_stack(settings.state_dir)


def run(s: MultiGpuSettings, work: Path, out: Path) -> list[dict]:
    """Build, measure every layout side by side; write multi_gpu.{csv,md,json} under out."""
    out.mkdir(parents=True, exist_ok=True)
    repo, model = build(s, work)
    rows = []
    for name, servers in layouts(repo, model, s, work).items():
        rows.append(measure_layout(name, list(servers), model, s, out))
        (out / "multi_gpu.json").write_text(json.dumps(rows, indent=2))
    if s.envoy:
        rows += envoy_rows(repo, model, s, work, out)
        (out / "multi_gpu.json").write_text(json.dumps(rows, indent=2))
    base = rows[0]["img_per_s"]
    for row in rows:
        row["scaling"] = round(row["img_per_s"] / base, 3) if base else 0.0
    _write(rows, s, out)
    return rows


def _write(rows: list[dict], s: MultiGpuSettings, out: Path) -> None:
    with open(out / "multi_gpu.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    title = (
        f"# {s.model} on {s.gpus} GPUs: batch {s.batch}, {s.concurrency_per_gpu} requests in flight per GPU, "
        f"{s.instances_per_gpu} instances per GPU, gRPC + CUDA shared memory"
    )
    header = "| layout | img/s | per client | scaling vs 1 GPU | worst client p50 ms |"
    lines = [title, "", header, "|---|---:|---|---:|---:|"]
    lines += [
        f"| {r['layout']} | {r['img_per_s']:,.0f} | {', '.join(f'{c:,.0f}' for c in r['per_client'])} | "
        f"{r['scaling']:.3f} | {r['p50_ms']:.1f} |"
        for r in rows
    ]
    (out / "multi_gpu.md").write_text("\n".join(lines) + "\n")
