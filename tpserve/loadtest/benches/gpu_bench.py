"""CPU vs GPU vs TensorRT for one model, in-process and served through Triton, in one run.

The CPU vs GPU vs TensorRT table: onnxruntime and torch on the CPU, torch CUDA fp32, fp16 channels_last,
fp16 + CUDA graphs, the compiled engines (torch.compile/inductor fp16 and bf16 + CUDA graphs),
and TensorRT (marked unavailable with the reason where it is). Each is timed in-process
(batch-1 latency, throughput at a large batch) and, where the embedded server can serve it,
through Triton with perf_analyzer (batch 1 for latency over gRPC, gRPC with CUDA shared memory and HTTP: the
fastest is reported; CUDA shared memory at saturation
for throughput). Serving efficiency = served / in-process at the same batch. The compiled
engine's cold start (server start to ready, with and without the build's compile cache) is
timed on a repository of its own.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpserve.common.cli import step
from tpserve.common.endpoints import PROTOCOL_NAMES
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.reporting.html_page import write_html
from tpserve.loadtest.reporting.perf_rows import markdown_table as perf_markdown
from tpserve.loadtest.reporting.plots import pyplot, save


@dataclass(kw_only=True)
class BenchRow:
    """One runtime: in-process and served figures (None where not measured)."""

    runtime: str
    inproc_b1_ms: float | None = None
    inproc_tput: float | None = None
    inproc_batch: int | None = None
    served_b1_p50_ms: float | None = None
    served_tput: float | None = None
    served_setup: str = ""
    direct_b1_p50_ms: float | None = None  # the same points on a plain server (served: `server start`'s front)
    direct_tput: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def efficiency(self) -> float | None:
        if self.served_tput and self.inproc_tput:
            return self.served_tput / self.inproc_tput
        return None


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def latency_ms(fn, x, iters: int = 50) -> float:
    """Median wall time of fn(x) in ms (synchronized), after warmup."""
    for _ in range(5):
        fn(x)
    _sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn(x)
        _sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def throughput(fn, x, seconds: float = 3.0) -> float:
    """Samples/s of fn on batch x over about `seconds`, after warmup."""
    for _ in range(3):
        fn(x)
    _sync()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(x)
        runs += 1
    _sync()
    return runs * len(x) / (time.perf_counter() - start)


def _torch_fn(module):
    import torch

    def run(x):
        with torch.inference_mode():
            return module(x)

    return run


def compiled_rows(spec, program: Path, gpu_batch: int, precisions=("fp16", "bf16")) -> list[BenchRow]:
    """The compiled engines in-process: fp16 and bf16, batch 1 and every bucket from gpu_batch up to the max."""
    import torch

    from tpserve.builders.formats.torch_compiled import compile_engine
    from tpserve.builders.repository.writer import TorchRuntime
    from tpserve.triton_models.runtime.torch_runtime import DTYPES

    rows, shape = [], tuple(spec.inputs[0].dims)
    batches = [b for b in (gpu_batch, 2 * gpu_batch, 4 * gpu_batch) if b <= spec.max_batch_size]
    for precision, name in [(p, n) for p, n in (("fp16", COMPILED), ("bf16", COMPILED_BF16)) if p in precisions]:
        step(f"gpu-bench: in-process {name} (compiling)")
        runtime = TorchRuntime(precision=precision, channels_last=True, cuda_graphs=True, compiler="inductor")
        engine, seconds = compile_engine(program, spec, runtime, "cuda")
        runner = _torch_fn(engine)  # its static buffers are inference tensors
        by_batch = {b: throughput(runner, _images(b, shape, DTYPES[precision])) for b in batches}
        b1 = latency_ms(runner, _images(1, shape, DTYPES[precision]))
        rows.append(
            BenchRow(
                runtime=name,
                inproc_b1_ms=b1,
                inproc_tput=by_batch[gpu_batch],
                inproc_batch=gpu_batch,
                extra={"inproc_by_batch": by_batch, "compile_seconds": seconds},
            )
        )
        rows[-1].note = "in-process img/s by batch: " + ", ".join(f"{b}: {v:,.0f}" for b, v in by_batch.items())
        del runner, engine
        torch.cuda.empty_cache()
    return rows


def _images(batch: int, shape: tuple, dtype):
    import torch

    return torch.randn(batch, *shape, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)


def inprocess_rows(spec, onnx_path: Path, weights: Path, gpu_batch: int, cpu_batch: int) -> list[BenchRow]:
    """Every runtime in-process: CPU (onnxruntime, torch), CUDA fp32, fp16 channels_last, + graphs."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from tpserve.builders.spec.zoo import architecture
    from tpserve.triton_models.runtime.torch_runtime import GraphRunner

    shape = tuple(spec.inputs[0].dims)
    x1, xb = (np.random.default_rng(0).standard_normal((b, *shape)).astype(np.float32) for b in (1, cpu_batch))
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ort_fn = lambda x: session.run(None, {spec.inputs[0].name: x})  # noqa: E731
    rows = [_row("onnxruntime CPU fp32", ort_fn, x1, xb)]
    module = architecture(spec)
    module.load_state_dict(torch.load(weights, map_location="cpu"))
    rows.append(_row("torch CPU fp32", _torch_fn(module), torch.from_numpy(x1), torch.from_numpy(xb)))
    if not torch.cuda.is_available():
        return rows + [BenchRow(runtime=r, note="no CUDA GPU here") for r in GPU_RUNTIMES] + [tensorrt_row()]
    x1g, xbg = (torch.randn(b, *shape, device="cuda") for b in (1, gpu_batch))
    fp32 = module.cuda()
    rows.append(_row("torch CUDA fp32 eager", _torch_fn(fp32), x1g, xbg))
    fp16 = architecture(spec)
    fp16.load_state_dict(torch.load(weights, map_location="cpu"))
    fp16 = fp16.cuda().half().to(memory_format=torch.channels_last)
    cl = lambda x: x.half().contiguous(memory_format=torch.channels_last)  # noqa: E731
    rows.append(_row("torch CUDA fp16 channels_last", _torch_fn(fp16), cl(x1g), cl(xbg)))
    graphs = GraphRunner(fp16, shape, torch.float16, "cuda", (1, gpu_batch), channels_last=True)
    rows.append(_row("torch CUDA fp16 channels_last + CUDA graphs", graphs, cl(x1g), cl(xbg)))
    return rows + [tensorrt_row()]


GPU_RUNTIMES = ("torch CUDA fp32 eager", "torch CUDA fp16 channels_last", "torch CUDA fp16 channels_last + CUDA graphs")
COMPILED = "torch.compile (inductor) fp16 channels_last + CUDA graphs"
COMPILED_U8 = COMPILED + ", uint8 input"
COMPILED_BF16 = "torch.compile (inductor) bf16 channels_last + CUDA graphs"
COMPILED_U8_UNSTAGED = COMPILED_U8 + ", earlier request path (unstaged)"
COMPILED_U8_INPROC = COMPILED_U8 + ", in-process backend"
COMPILED_U8_INPROC_PYTHON = COMPILED_U8_INPROC + ", batches through Python"
ECHO = "echo: an engine that does nothing, served as the in-process row above (what serving costs here)"
COMPILED_VARIANTS = (
    COMPILED_U8,
    COMPILED_U8_UNSTAGED,
    COMPILED_U8_INPROC,
    COMPILED_U8_INPROC_PYTHON,
)  # served only: in-process figures are COMPILED's


def served_rows(keys: list[str]) -> tuple[str, ...]:
    """Runtime names of the served rows for short keys (--served); empty: all of them."""
    names = {
        "onnx": "onnxruntime CPU fp32",
        "fp32": "torch CUDA fp32 eager",
        "graphs": GRAPHS,
        "graphs_u8": GRAPHS_U8,
        "inductor": COMPILED,
        "inductor_u8": COMPILED_U8,
        "inductor_u8_unstaged": COMPILED_U8_UNSTAGED,
        "inductor_u8_inproc": COMPILED_U8_INPROC,
        "inductor_u8_inproc_python": COMPILED_U8_INPROC_PYTHON,
    }
    unknown = [k for k in keys if k not in names]
    if unknown:
        raise MeasurementError(f"--served {unknown}: unknown; choose among {sorted(names)}")
    return tuple(names[k] for k in keys)


def _row(name, fn, x1, xb) -> BenchRow:
    step(f"gpu-bench: in-process {name}")
    return BenchRow(runtime=name, inproc_b1_ms=latency_ms(fn, x1), inproc_tput=throughput(fn, xb), inproc_batch=len(xb))


def tensorrt_row() -> BenchRow:
    """The TensorRT row: measured elsewhere (the NGC path) or marked unavailable with the reason."""
    from tpserve.builders.formats.tensorrt_build import TensorRTUnavailable, require_tensorrt

    try:
        require_tensorrt()
    except TensorRTUnavailable as err:
        return BenchRow(
            runtime="TensorRT fp16",
            note=f"unavailable: {str(err).split(':')[0]} (no wheel reachable here); "
            "measure with make build-engines-docker + make perf-docker",
        )
    return BenchRow(
        runtime="TensorRT fp16", note="tensorrt imports: time plans with `python -m tpserve.builders engines` (trtexec)"
    )


def rows_from_csv(path: Path) -> list[BenchRow]:
    """BenchRows back from gpu_bench.csv (to re-plot or re-tabulate a run made elsewhere)."""
    import csv
    import dataclasses

    numbers = {f.name for f in dataclasses.fields(BenchRow)} - {"runtime", "served_setup", "note", "extra"}
    with open(path, newline="") as handle:
        records = list(csv.DictReader(handle))
    parse = lambda k, v: (float(v) if v else None) if k in numbers else v  # noqa: E731
    fields: list[dict[str, Any]] = [{k: parse(k, v) for k, v in r.items() if k != "efficiency"} for r in records]
    return [BenchRow(**f) for f in fields]


def markdown(rows: list[BenchRow], header: str) -> str:
    """The CPU vs GPU vs TensorRT table, with served figures and serving efficiency."""
    fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    lines = [
        header,
        "",
        "| runtime | in-process batch 1 (ms) | in-process img/s (batch) | served batch-1 p50 (ms) "
        "| served img/s | served / in-process | a plain server (no front): batch-1 p50 ms, img/s | served setup "
        "| note |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        batch = f" ({r.inproc_batch})" if r.inproc_batch else ""
        lines.append(
            f"| {r.runtime} | {fmt(r.inproc_b1_ms, '.2f')} | {fmt(r.inproc_tput, ',.0f')}{batch} | "
            f"{fmt(r.served_b1_p50_ms, '.2f')} | {fmt(r.served_tput, ',.0f')} | {fmt(r.efficiency, '.2f')} | "
            f"{_direct(r, fmt)} | {r.served_setup} | {r.note} |"
        )
    return "\n".join(lines)


def _direct(row: BenchRow, fmt) -> str:
    if row.direct_b1_p50_ms is None and row.direct_tput is None:
        return "—"
    return f"{fmt(row.direct_b1_p50_ms, '.2f')}, {fmt(row.direct_tput, ',.0f')}"


def plot(rows: list[BenchRow], path: Path) -> Path:
    """Bars: in-process vs served throughput per runtime (log scale)."""
    plt = pyplot()

    measured = [r for r in rows if r.inproc_tput]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(measured))
    ax.bar([x - 0.2 for x in xs], [r.inproc_tput for r in measured], 0.4, label="in-process")
    ax.bar([x + 0.2 for x in xs], [r.served_tput or 0 for r in measured], 0.4, label="served (Triton)")
    import textwrap

    ax.set_xticks(list(xs), [textwrap.fill(r.runtime, 18) for r in measured], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("images/s")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path)


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """What gpu-bench builds, serves and how hard it pushes."""

    model: str = "resnet50"
    gpu_batch: int = 256
    cpu_batch: int = 8
    served_points: tuple[tuple[int, int], ...] = ((64, 4), (128, 4), (64, 8), (256, 2))  # (batch, concurrency)
    instances: int = 2
    measurement_ms: int = 3000
    max_batch: int = 0  # the served models' max batch (0: gpu_batch); the compiled rows measure up to it
    served: tuple[str, ...] = ()  # served rows (runtime names); empty: every servable one
    quick: bool = False  # only the compiled fp16 rows and the served ones: no CPU/eager rows, no bf16, no cold start
    direct: bool = True  # each served row also on a plain server (no front), beside the default's


def _served_variants(spec, work: Path, repo: Path, settings: BenchSettings) -> dict:
    """Build the repository: ONNX on the CPU, torch fp32 and fp16+graphs on the GPU; runtime -> model."""
    import torch

    from tpserve.builders.build import build_model, build_torch_variant
    from tpserve.builders.repository.writer import ServingOptions, TorchRuntime
    from tpserve.builders.request import BuildRequest

    serve_onnx = not settings.served or "onnxruntime CPU fp32" in settings.served
    build_model(
        BuildRequest(
            spec=spec,
            target="embedded",
            repo=repo if serve_onnx else work / "scratch_repo",
            work_dir=work,
            options=ServingOptions(),
        )
    )
    variants = {"onnxruntime CPU fp32": spec.name} if serve_onnx else {}
    if not torch.cuda.is_available():
        return variants
    # Requests arrive at the max batch here, so several instances need no batcher (and must not have one:
    # torch_config refuses KIND_GPU instances > 1 with dynamic batching).
    gpu = ServingOptions(
        instances=settings.instances, kind="KIND_GPU", max_queue_delay_us=0, dynamic_batching=settings.instances == 1
    )
    graphs: dict[str, Any] = dict(channels_last=True, cuda_graphs=True)
    compiled: dict[str, Any] = dict(graphs, compiler="inductor", host_outputs=True)
    unstaged: dict[str, Any] = dict(compiled, uint8_input=True, staged=False)
    for runtime, name in (
        (TorchRuntime(precision="fp32"), "torch CUDA fp32 eager"),
        (TorchRuntime(precision="fp16", **graphs), GRAPHS),
        (TorchRuntime(precision="fp16", uint8_input=True, **graphs), GRAPHS_U8),
        (TorchRuntime(precision="fp16", **compiled), COMPILED),
        (TorchRuntime(precision="fp16", uint8_input=True, **compiled), COMPILED_U8),
        (TorchRuntime(precision="fp16", **unstaged), COMPILED_U8_UNSTAGED),
        (TorchRuntime(precision="fp16", uint8_input=True, inprocess=True, **compiled), COMPILED_U8_INPROC),
        (
            TorchRuntime(precision="fp16", uint8_input=True, inprocess=True, native=False, **compiled),
            COMPILED_U8_INPROC_PYTHON,
        ),
    ):
        if settings.served and name not in settings.served:
            continue
        variants[name] = build_torch_variant(
            BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=work, options=gpu), runtime
        )["name"]
    if COMPILED_U8_INPROC in variants:  # beside it, what serving costs on this host
        variants[ECHO] = _echo_variant(spec, work, repo, gpu, compiled)
    return variants


def _echo_variant(spec, work: Path, repo: Path, options, compiled: dict) -> str:
    """The echo of spec (builders/spec/zoo/echo.py) built and served like the in-process compiled variant."""
    from tpserve.builders.build import build_model, build_torch_variant
    from tpserve.builders.repository.writer import TorchRuntime
    from tpserve.builders.request import BuildRequest
    from tpserve.builders.spec.zoo import echo

    twin = echo.spec_like(spec)
    build_model(BuildRequest(spec=twin, target="embedded", repo=work / "scratch_repo", work_dir=work))
    runtime = TorchRuntime(precision="fp16", uint8_input=True, inprocess=True, **compiled)
    request = BuildRequest(spec=twin, target="embedded", repo=repo, work_dir=work, options=options)
    return build_torch_variant(request, runtime)["name"]


GRAPHS = "torch CUDA fp16 channels_last + CUDA graphs"
GRAPHS_U8 = GRAPHS + ", uint8 input normalized on the GPU"


def _point(ep, analyzer, model, batch, concurrency, shm, settings, raw) -> dict:
    from tpserve.loadtest.perf.sweep import Sweep, run_sweep

    sweep = Sweep(
        model,
        concurrency=(concurrency,),
        batch_sizes=(batch,),
        shared_memory=shm,
        measurement_ms=settings.measurement_ms,
        max_trials=10,
        stability_percent=50,
        output_shm_bytes=batch * 1000 * 4,
    )
    (row,) = run_sweep(sweep, ep, analyzer, raw)
    return {**row, "shm": shm}


def _describe(point: dict) -> str:
    from tpserve.loadtest.reporting.perf_rows import stability

    flag = "" if point.get("stable", "yes") == "yes" else f", {stability(point)}"
    protocol = PROTOCOL_NAMES.get(point.get("protocol", "grpc"), "gRPC")
    return (
        f"{protocol} b{point['batch']} c{point['level']:g} shm={point['shm']} "
        f"(queue {point['queue_us']:.0f} µs, "
        f"infer {point['compute_infer_us']:.0f} µs, in {point['compute_input_us']:.0f} µs, "
        f"out {point['compute_output_us']:.0f} µs{flag})"
    )


def _measure_served(eps: dict, analyzer, model: str, gpu: bool, settings: BenchSettings, raw: Path) -> tuple:
    """Best batch-1 p50 (over gRPC with and without CUDA shared memory, and HTTP: the fastest transport is the
    latency row's), best throughput (and its batch) over the configured points; all points are kept."""
    ep = eps["grpc"]
    shms = ("none", "cuda") if gpu else ("none",)
    latency = [_point(ep, analyzer, model, 1, 1, shm, settings, raw) for shm in shms]
    latency.append(_point(eps["http"], analyzer, model, 1, 1, "none", settings, raw))
    points = settings.served_points if gpu else ((settings.cpu_batch, 4),)
    saturated = [_point(ep, analyzer, model, b, c, shms[-1], settings, raw) for b, c in points]
    best_latency, best = min(latency, key=lambda p: p["p50_ms"]), max(saturated, key=lambda p: p["throughput"])
    setup = f"latency: {_describe(best_latency)}; throughput: {_describe(best)}"
    return best_latency["p50_ms"], best["throughput"], setup, latency + saturated, best["batch"]


def cold_start(repo: Path, model: str, out: Path, with_cache: bool = True) -> float:
    """Seconds from starting a server on a repository holding only `model` to ready, with empty local caches.

    with_cache=False drops the build's compile_cache.bin: the engine is then compiled from scratch.
    """
    import json
    import os
    import shutil
    import tempfile

    from tpserve.server.triton.launcher import running

    alone = out / f"cold-{model}-{'cache' if with_cache else 'nocache'}"
    shutil.copytree(repo / model, alone / model)
    manifest = json.loads((repo / "manifest.json").read_text())
    manifest["models"] = {model: manifest["models"][model]}
    (alone / "manifest.json").write_text(json.dumps(manifest))
    if not with_cache:
        (alone / model / "1" / "compile_cache.bin").unlink(missing_ok=True)
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="cold-inductor-") as tmp:
        os.environ.update(TORCHINDUCTOR_CACHE_DIR=tmp, TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
        started = time.time()
        try:
            with running(alone, alone / "state", startup_timeout=600):
                return round(time.time() - started, 1)
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def run(settings: BenchSettings, out: Path) -> list[BenchRow]:
    """Build, measure in-process, serve, measure served; write gpu_bench.{csv,md,png} under out."""
    import csv
    import dataclasses

    from tpserve.builders.spec import zoo
    from tpserve.loadtest.perf.tools import find_perf_analyzer
    from tpserve.server.fronts import served_as_started

    spec = zoo.get_spec(settings.model, max_batch_size=max(settings.max_batch, settings.gpu_batch))
    spec = dataclasses.replace(spec, validation_batch_sizes=(1, 2))
    work, repo = out / "work", out / "repo"
    variants = _served_variants(spec, work, repo, settings)
    rows = (
        [tensorrt_row()]
        if settings.quick
        else inprocess_rows(
            spec, work / spec.name / "model.onnx", work / spec.name / "model.pt", settings.gpu_batch, settings.cpu_batch
        )
    )
    if COMPILED in variants or any(name in variants for name in COMPILED_VARIANTS):
        precisions = ("fp16",) if settings.quick else ("fp16", "bf16")
        compiled = compiled_rows(spec, work / spec.name / "model.pt2", settings.gpu_batch, precisions)
        at = rows.index(next(r for r in rows if r.runtime.startswith("TensorRT")))
        same = [
            BenchRow(runtime=name, note="in-process figures: the row above")
            for name in COMPILED_VARIANTS
            if name in variants
        ]
        rows[at:at] = compiled[:1] + same + compiled[1:]
    if ECHO in variants:
        at = rows.index(next(r for r in rows if r.runtime == COMPILED_U8_INPROC))
        rows.insert(at + 1, BenchRow(runtime=ECHO, note="served batch-1 p50 minus this: what the engine adds"))
    if GRAPHS_U8 in variants:  # served only: same in-process runtime as GRAPHS
        graphs = next(r for r in rows if r.runtime == GRAPHS)
        extra_row = BenchRow(
            runtime=GRAPHS_U8,
            inproc_tput=graphs.inproc_tput,
            inproc_batch=graphs.inproc_batch,
            note="in-process figures: the row above",
        )
        rows.insert(rows.index(graphs) + 1, extra_row)
    analyzer = find_perf_analyzer()
    serving = served_as_started(repo, out / "state", direct=settings.direct, startup_timeout=600)
    with serving as (state, inner):  # `server start`'s path; a plain server's figure beside
        eps = {protocol: state.endpoint(protocol, repo) for protocol in ("grpc", "http")}
        direct = {protocol: inner.endpoint(protocol, repo) for protocol in ("grpc", "http")} if inner else {}
        for row in rows:
            if row.runtime in variants:
                step(f"gpu-bench: served {row.runtime} ({variants[row.runtime]})")
                check_outputs(eps["grpc"], variants[row.runtime])
                gpu = "CUDA" in row.runtime or "inductor" in row.runtime
                row.served_b1_p50_ms, row.served_tput, row.served_setup, points, batch = _measure_served(
                    eps, analyzer, variants[row.runtime], gpu, settings, out / "raw"
                )
                row.extra["points"] = points
                if settings.direct:
                    row.direct_b1_p50_ms, row.direct_tput, _, alone, _ = _measure_served(
                        direct, analyzer, variants[row.runtime], gpu, settings, out / "raw" / "direct"
                    )
                    row.extra["direct_points"] = alone
                _same_batch(row, rows, batch)
                _write(rows, out, settings, csv)  # as results come: a run cut short keeps what it measured
    for name in () if settings.quick else (COMPILED_U8, COMPILED):
        if name in variants:
            _cold_starts(next(r for r in rows if r.runtime == name), repo, variants[name], out)
            break
    _write(rows, out, settings, csv)
    return rows


def check_outputs(ep, model: str, batch: int = 2) -> None:
    """One request before measuring: every output holds batch x its dims of finite values, or MeasurementError.

    perf_analyzer does not read outputs: a model answering with empty or garbage tensors would be timed as fast.
    """
    from tpserve.clients.checks import CheckFailed, smoke
    from tpserve.common.errors import MeasurementError

    try:
        smoke(ep, model, "", None, batch)
    except CheckFailed as err:
        raise MeasurementError(f"{model}: {err}; the server answers wrongly, so it is not measured") from err


def _same_batch(row: BenchRow, rows: list[BenchRow], batch: int) -> None:
    """Compiled rows: in-process figures at the batch the best served point used (efficiency at the same batch)."""
    source = row if "inproc_by_batch" in row.extra else None
    if source is None and row.runtime in COMPILED_VARIANTS:
        source = next(r for r in rows if r.runtime == COMPILED)
    by_batch = source.extra.get("inproc_by_batch", {}) if source else {}
    if batch in by_batch:
        row.inproc_tput, row.inproc_batch = by_batch[batch], batch


def _cold_starts(row: BenchRow, repo: Path, model: str, out: Path) -> None:
    step(f"gpu-bench: cold start of {model} (empty local caches; with, then without the build's compile cache)")
    row.extra["cold_start_s"] = {
        "with compile cache": cold_start(repo, model, out),
        "without (compiled at load)": cold_start(repo, model, out, with_cache=False),
    }
    row.note = (
        (row.note + "; " if row.note else "")
        + "cold start to ready: "
        + ", ".join(f"{k} {v} s" for k, v in row.extra["cold_start_s"].items())
    )


def _write(rows, out: Path, settings: BenchSettings, csv) -> None:
    import dataclasses
    import json

    from tpserve.builders.environment import host_info, tool_versions

    with open(out / "gpu_bench.csv", "w", newline="") as handle:
        fields = [f.name for f in dataclasses.fields(BenchRow) if f.name != "extra"] + ["efficiency", "instances"]
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            served = settings.instances if r.served_tput else ""
            writer.writerow(
                {
                    **{k: v for k, v in dataclasses.asdict(r).items() if k != "extra"},
                    "efficiency": r.efficiency,
                    "instances": served,
                }
            )
    host = host_info()
    header = (
        f"# {settings.model}: CPU vs GPU vs TensorRT\n\nHost: {host['gpu']}, {host['cpu']} ({host['cores']} "
        f"cores); versions {tool_versions()}; settings {dataclasses.asdict(settings)}"
    )
    points = [p for r in rows for p in r.extra.get("points", [])]
    perf_table = "\n\n## Every served point\n\n" + perf_markdown(points) if points else ""
    (out / "gpu_bench.json").write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=2, default=str))
    write_report(rows, out, header, perf_table)


def write_report(rows: list[BenchRow], out: Path, header: str, perf_table: str = "") -> Path:
    """gpu_bench.png, gpu_bench.md and gpu_bench.html in out; returns the markdown's path."""
    try:
        plot(rows, out / "gpu_bench.png")
    except ImportError as err:
        step(f"gpu-bench: no plot ({err})")
    figure = "\n\n![img/s by runtime](gpu_bench.png)" if (out / "gpu_bench.png").exists() else ""
    (out / "gpu_bench.md").write_text(markdown(rows, header) + figure + perf_table + "\n")
    write_html(out / "gpu_bench.md")
    return out / "gpu_bench.md"
