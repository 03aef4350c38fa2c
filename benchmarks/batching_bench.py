"""{no batching, dynamic batching} x {1, 2 instances} x concurrency, per model, in one run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from tpserve.common.cli import step

VARIANTS = ((False, 1), (True, 1), (False, 2), (True, 2))  # (dynamic batching, instances)


def _variant_name(model: str, batching: bool, instances: int) -> str:
    return f"{model}_{'dynbatch' if batching else 'nobatch'}_i{instances}"


def build_variants(spec, repo: Path, work: Path, delay_us: int, gpu: bool = False, host_outputs: bool = False) -> dict:
    """Build the model once, then write its four serving variants; name -> (model, batching, instances).

    CPU: ONNX Runtime (threads per instance = cores / instances). GPU: the torch runtime in fp16
    with CUDA graphs on KIND_GPU instances (outputs through CUDA IPC, or host memory with host_outputs).
    """
    from tpserve.builders.build import build_model
    from tpserve.builders.repository import writer as repository
    from tpserve.builders.request import BuildRequest

    build_model(BuildRequest(spec=spec, target="embedded", repo=work / "scratch_repo", work_dir=work))
    cores, variants = os.cpu_count() or 1, {}
    for batching, instances in VARIANTS:
        variant = dataclasses.replace(spec, name=_variant_name(spec.name, batching, instances))
        options = repository.ServingOptions(
            instances=instances,
            max_queue_delay_us=delay_us,
            dynamic_batching=batching,
            intra_op_threads=max(1, cores // instances),
            kind="KIND_GPU" if gpu else "KIND_CPU",
        )
        config, artifacts = _serving(spec, variant, options, work, gpu, host_outputs)
        repository.write_model(repo, variant, config, artifacts, "embedded")
        variants[variant.name] = (spec.name, batching, instances)
    return variants


def _serving(spec, variant, options, work: Path, gpu: bool, host_outputs: bool):
    from tpserve.builders.repository import writer as repository
    from tpserve.triton_models import TORCH_MODEL

    if not gpu:
        return repository.model_config(variant, "embedded", options), {"model.onnx": work / spec.name / "model.onnx"}
    runtime = repository.TorchRuntime(precision="fp16", channels_last=True, cuda_graphs=True, host_outputs=host_outputs)
    # This benchmark measures the configuration torch_config refuses (KIND_GPU instances > 1 with dynamic
    # batching): build it without the batcher, then add the batcher to the measured copy deliberately.
    unbatched = dataclasses.replace(options, dynamic_batching=False)
    config = dataclasses.replace(repository.torch_config(spec, runtime, unbatched), name=variant.name)
    if options.dynamic_batching:
        batcher = repository.model_config(spec, "embedded", options).dynamic_batching
        config = dataclasses.replace(config, dynamic_batching=batcher)
    (work / spec.name / "spec.json").write_text(json.dumps(spec.to_dict()))
    return config, {
        "model.pt2": work / spec.name / "model.pt2",
        "spec.json": work / spec.name / "spec.json",
        "model.py": TORCH_MODEL,
    }


def measure(variants: dict, ep, analyzer, concurrency: tuple, interval_ms: int, raw: Path) -> list[dict]:
    """perf_analyzer (gRPC, batch 1) at each concurrency, for every variant."""
    from tpserve.loadtest.perf.sweep import Sweep, run_sweep

    rows = []
    for name, (model, batching, instances) in variants.items():
        step(f"batching-bench: {name}")
        sweep = Sweep(name, concurrency=concurrency, measurement_ms=interval_ms, max_trials=10, stability_percent=50)
        for row in run_sweep(sweep, ep, analyzer, raw):
            rows.append(
                {**row, "base_model": model, "batching": "dynamic" if batching else "none", "instances": instances}
            )
    return rows


def ratio_table(rows: list[dict]) -> str:
    """Dynamic / no batching throughput, per model, instances and concurrency."""
    lines = [
        "| model | instances | concurrency | no batching infer/s | dynamic infer/s | dynamic / none |",
        "|" + "---|" * 6,
    ]
    keyed = {(r["base_model"], r["instances"], r["level"], r["batching"]): r for r in rows}
    for model, instances, level, batching in sorted(keyed):
        if batching != "dynamic":
            continue
        none, dyn = keyed.get((model, instances, level, "none")), keyed[(model, instances, level, "dynamic")]
        if none:
            lines.append(
                f"| {model} | {instances} | {level:g} | {none['throughput']:.1f} | {dyn['throughput']:.1f} | "
                f"{dyn['throughput'] / none['throughput']:.2f}x |"
            )
    return "\n".join(lines)


def detail_table(rows: list[dict]) -> str:
    """Every point: throughput, latency percentiles, queue and compute time."""
    lines = [
        "| model | batching | instances | concurrency | infer/s | p50 ms | p99 ms | queue µs | infer µs |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r['base_model']} | {r['batching']} | {r['instances']} | {r['level']:g} | "
            f"{r['throughput']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['queue_us']:.0f} | "
            f"{r['compute_infer_us']:.0f} |"
        )
    return "\n".join(lines)


def run(models, out: Path, concurrency, interval_ms: int, delay_us: int, gpu: bool, host_outputs: bool) -> str:
    """Build every model's four variants, serve them on free ports, measure, write batching.csv and
    batching.md into out; return the report's text."""
    from tpserve.builders.spec import zoo
    from tpserve.loadtest.perf.tools import find_perf_analyzer
    from tpserve.loadtest.reporting.perf_rows import write_csv
    from tpserve.server.triton.launcher import running

    repo, variants = out / "repo", {}
    for name in models:
        variants.update(build_variants(zoo.get_spec(name), repo, out / "work", delay_us, gpu, host_outputs))
    with running(repo, out / "state") as state:
        ep = state.endpoint("grpc", repo)
        rows = measure(variants, ep, find_perf_analyzer(), concurrency, interval_ms, out / "raw")
    hidden = ("base_model", "batching", "instances")
    write_csv([{k: r[k] for k in r if k not in hidden} for r in rows], out / "batching.csv")
    text = f"## dynamic / no batching\n\n{ratio_table(rows)}\n\n## every point\n\n{detail_table(rows)}\n"
    (out / "batching.md").write_text(text)
    return text
