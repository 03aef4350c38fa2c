"""Text models measured like the image models: the in-process ceiling, served from token ids, served from text.

One run builds a sequence model (a spec-file encoder; pooling in the engine), then measures, for each length
distribution (seeded lognormal, and all sentences at 32 tokens):
- in-process: eager with every batch padded to the longest length, eager sorted by length with each batch
  padded to its own longest (sentence-transformers' way), and the served engine's own runner (compiled, CUDA
  graphs over the same length and batch buckets on a GPU) on the same sentences;
- served from token ids: perf_analyzer, 32 sentences per request over a concurrency sweep, and single-sentence
  requests at high concurrency over gRPC and over HTTP (our closed-loop client); the mean batch from Triton's
  statistics, padding efficiency and graph memory from the runner's own statistics (TRITON_RAGGED_STATS);
- served from raw text through <model>_pipeline (tokenize step batched, encoder pooled);
- one 32-token sentence, batch 1: p50 from ids and from text.
Every row names the shapes it was measured with. On a host without a GPU the same rows run on the CPU, with
"before" rows: the same model served as it was before ragged batching (requests of different lengths never
share a batch, one instance) and as it is served now (batching across lengths, two instances sharing the
cores), and each half of that change alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tpserve.clients.breakdown import PHASES, breakdown
from tpserve.common.cli import step
from tpserve.common.endpoints import PROTOCOL_NAMES, PROTOCOLS
from tpserve.loadtest.reporting.html_page import write_html
from tpserve.loadtest.workloads import text as tw

ONNX_QUEUE_DELAY_US = 500  # the CPU's ONNX rows
SINGLE_PROTOCOLS = ("grpc", "http")  # single sentences at high concurrency, the engine and its echo, over each


@dataclass(frozen=True, kw_only=True)
class TextBenchSettings:
    """What the text bench builds and how hard it pushes."""

    spec_file: Path = Path("examples/text/models.toml")
    model: str = "minilm_l6_random"
    lengths: tuple[str, ...] = ("lognormal", "fixed:32")
    sentences: int = 0  # 0: 8192 on a GPU, 256 on a CPU (see for_device)
    batch: int = 256  # in-process batch (sentences per run)
    per_request: int = 32
    concurrency: tuple[int, ...] = ()  # requests of per_request sentences (): 16 64 128 on a GPU, 4 on a CPU
    single_concurrency: tuple[int, ...] = ()  # single-sentence requests (): 256 on a GPU, 16 on a CPU
    interval_ms: int = 3000
    precision: str = ""  # "": fp16 on a GPU, fp32 on a CPU
    tokenizer: Path | None = None  # tokenizer.json for the text rows (default: the minilm package's)
    instances: int = 0  # 0: 1 (a second in-process instance bought no throughput on an H100 and cost latency)
    max_batch: int = 0  # the served model's max batch (rows per dynamic batch; 0: 1024 on a GPU, the spec's on a CPU)
    queue_delay_us: int = 0  # the served engine's and tokenize step's max_queue_delay (the ONNX rows: 500)
    before: bool = True  # CPU: also serve the model as it was before ragged batching
    text: bool = True  # the rows served from raw text
    python_too: bool = False  # GPU: the same engine through Python's per-batch path (native_path 0) served beside
    latency_summaries: bool = True  # Triton's p99 summaries (off: the alert rules' p99 is the backend's histogram)
    direct: bool = True  # each served point also on a plain server (no front), beside the default's


def for_device(settings: TextBenchSettings, gpu: bool) -> TextBenchSettings:
    """The settings with every 0 or () filled for this host: the H100 run of record's on a GPU; on a CPU, sizes
    that finish in minutes (eager padding to 256 tokens runs at about a thousand tokens/s on two cores)."""
    defaults = dict(sentences=8192, concurrency=(16, 64, 128), single_concurrency=(256,), instances=1, max_batch=1024)
    if not gpu:
        defaults = dict(sentences=256, concurrency=(4,), single_concurrency=(16,), instances=1, max_batch=0)
    filled: dict[str, Any] = {k: v for k, v in defaults.items() if not getattr(settings, k)}
    return dataclasses.replace(settings, **filled)


@dataclass(kw_only=True)
class TextRow:
    """One measured point."""

    path: str  # in-process | served ids | served text
    runtime: str
    lengths: str
    per_request: int = 0
    concurrency: int = 0
    sentences_s: float | None = None
    tokens_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_batch: float | None = None
    padding_efficiency: float | None = None
    gpu_mib: float | None = None
    direct_sentences_s: float | None = None  # the same point on a plain server (served rows: `server start`'s front)
    direct_p50_ms: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, runs: int = 3) -> float:
    """Best wall time of fn() over runs (after one warm-up run), synchronized."""
    fn()
    _sync()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        _sync()
        best = min(best, time.perf_counter() - start)
    return best


def _median_ms(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    _sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


# --- in-process
def eager_rows(module, lengths: np.ndarray, label: str, batch: int, device: str, longest: int) -> list[TextRow]:
    """Eager: every batch padded to the longest length; sorted, each batch padded to its own longest."""
    import torch

    ids, mask = tw.token_rows(lengths)
    real = int(lengths.sum())

    def padded_to(width, order):
        def run():
            with torch.inference_mode():
                for start in range(0, len(order), batch):
                    rows = order[start : start + batch]
                    w = width or int(lengths[rows].max())
                    a = torch.from_numpy(_pad(ids[rows], w)).to(device)
                    m = torch.from_numpy(_pad(mask[rows], w)).to(device)
                    module(a, m)

        return run

    rows = []
    for name, width, order in (
        (f"eager, every batch padded to {longest}", longest, np.arange(len(lengths))),
        ("eager, sorted by length, each batch padded to its longest", 0, np.argsort(lengths, kind="stable")),
    ):
        step(f"text-bench: in-process {name} ({label})")
        seconds = _timed(padded_to(width, order), runs=2)
        computed = _computed_tokens(lengths, order, batch, width)
        rows.append(_inproc_row(name, label, len(lengths), real, seconds, real / computed))
    return rows


def _pad(array: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((len(array), width), array.dtype)
    take = min(width, array.shape[1])
    out[:, :take] = array[:, :take]
    return out


def _computed_tokens(lengths, order, batch, width) -> int:
    return sum(
        len(rows) * (width or int(lengths[rows].max()))
        for rows in np.array_split(order, range(batch, len(order), batch))
    )


def _inproc_row(name, label, count, real, seconds, efficiency, note="") -> TextRow:
    return TextRow(
        path="in-process",
        runtime=name,
        lengths=label,
        sentences_s=count / seconds,
        tokens_s=real / seconds,
        padding_efficiency=efficiency,
        note=note,
    )


def runner_rows(runner, lengths: np.ndarray, label: str, batch: int) -> list[TextRow]:
    """The served engine's runner in-process: sorted sentences in batches, and batches in arrival order."""
    from tpserve.triton_models.runtime import ragged

    ids, mask = tw.token_rows(lengths)
    real, rows = int(lengths.sum()), []
    for name, order in (
        ("sorted by length", np.argsort(lengths, kind="stable")),
        ("batches in arrival order", np.arange(len(lengths))),
    ):
        batches = []
        for start in range(0, len(order), batch):
            picked = order[start : start + batch]
            width = int(lengths[picked].max())
            batches.append(
                ragged.RaggedBatch(
                    [{"input_ids": ids[picked, :width], "attention_mask": mask[picked, :width]}],
                    ["input_ids", "attention_mask"],
                    "attention_mask",
                )
            )

        def run(batches=batches):
            for b in batches:
                runner(b)

        before = dataclasses.replace(runner.counters)
        step(f"text-bench: in-process served engine, {name}, batches of {batch} ({label})")
        seconds = _timed(run, runs=3)
        done = runner.counters
        efficiency = (done.real_tokens - before.real_tokens) / max(done.computed_tokens - before.computed_tokens, 1)
        info = runner.describe()
        note = f"{info['graphs']} graphs, lengths {info['length_buckets']}, token budget {info['token_budget']}"
        what = f"served engine in-process ({name}, batches of {batch})"
        rows.append(_inproc_row(what, label, len(lengths), real, seconds, efficiency, note))
        rows[-1].gpu_mib = info["graph_bytes"] / 2**20 if info["graphs"] else None
    return rows


def text_words(settings) -> tuple[tuple[str, ...], float]:
    """What the texts are made of: the tokenizer's whole words with Zipf 1.1 weights (real text repeats its
    common words, and the tokenize step's word cache meets new ones), or the small built-in list without one."""
    path = settings.tokenizer or _default_tokenizer()
    return (tw.vocabulary(path), 1.1) if path is not None else (tw.WORDS, 0.0)


def tokenizer_rows(settings, workloads) -> list[TextRow]:
    """The tokenize step's own work on this host (tokenize_core: decode, one encode_batch per batch, cut per
    request), on the workload's texts in requests of per_request, batches of the served max batch."""
    from tpserve.triton_models.runtime.tokenize_core import load_tokenizer, tokenize

    path = settings.tokenizer or _default_tokenizer()
    if path is None:
        return []
    tokenizer, rows = load_tokenizer(str(path), 256), []
    per_batch = max(1, (settings.max_batch or 256) // settings.per_request)
    words, zipf = text_words(settings)
    for workload in workloads:
        lengths = workload.sample(settings.sentences)
        texts = tw.texts(lengths, 0, words, zipf)
        requests = [
            np.array([t.encode() for t in texts[i : i + settings.per_request]], dtype=object)
            for i in range(0, len(texts), settings.per_request)
        ]
        batches = [requests[i : i + per_batch] for i in range(0, len(requests), per_batch)]
        step(f"text-bench: the tokenize step alone ({workload.describe()})")
        fresh = load_tokenizer(str(path), 256)
        start = time.perf_counter()
        [tokenize(fresh, b) for b in batches]
        cold = time.perf_counter() - start
        seconds = _timed(lambda batches=batches: [tokenize(tokenizer, b) for b in batches], runs=3)
        note = (
            f"{settings.per_request} texts per request, {per_batch} requests per batch, {os.cpu_count()} cores; "
            f"{describe_words(words, zipf)}"
        )
        for what, took in (("word cache cold: its first pass", cold), ("word cache warm", seconds)):
            row = _inproc_row(f"tokenize step alone ({what})", workload.describe(), len(texts), 0, took, None, note)
            row.tokens_s = float(lengths.sum()) / took
            rows.append(row)
    return rows


def single_sentence_ms(runner, module, device: str, length: int = 32) -> tuple[float, float]:
    """One sentence of `length` tokens: eager module, and the served engine's runner (median ms)."""
    import torch

    from tpserve.triton_models.runtime import ragged

    ids, mask = tw.token_rows(np.array([length]))
    a, m = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
    batch = ragged.RaggedBatch(
        [{"input_ids": ids, "attention_mask": mask}], ["input_ids", "attention_mask"], "attention_mask"
    )

    def eager():
        with torch.inference_mode():
            module(a, m)

    return _median_ms(eager), _median_ms(lambda: runner(batch))


# --- build
def build(settings: TextBenchSettings, work: Path, repo: Path, gpu: bool):
    """The spec's model built into repo: the ONNX variant and the compiled engine (in-process backend), the text
    pipeline where a tokenizer is found, and with python_too on a GPU the engine through Python's per-batch path;
    returns (spec, {"engine": name, "pipeline": name or "", "python": name or ""})."""
    from tpserve.builders.build import build_model, build_torch_variant
    from tpserve.builders.repository import pipelines
    from tpserve.builders.repository.writer import ServingOptions, TorchRuntime
    from tpserve.builders.request import BuildRequest
    from tpserve.builders.spec import spec_file

    found = {m.spec.name: m for m in spec_file.load(settings.spec_file)}
    if settings.model not in found:
        from tpserve.common.errors import MeasurementError

        raise MeasurementError(f"{settings.spec_file} has no model {settings.model!r}; it has {sorted(found)}")
    spec = found[settings.model].spec
    if settings.max_batch:
        spec = dataclasses.replace(spec, max_batch_size=settings.max_batch)
    cpu = ServingOptions(max_queue_delay_us=ONNX_QUEUE_DELAY_US)
    # on a GPU host the ONNX variant stays out of the served repository (numpy 2 there: launcher.numpy_problem)
    build_model(
        BuildRequest(
            spec=spec, target="embedded", repo=work / "scratch_repo" if gpu else repo, work_dir=work, options=cpu
        )
    )
    precision = settings.precision or ("fp16" if gpu else "fp32")
    options = ServingOptions(
        instances=settings.instances, kind="KIND_GPU" if gpu else "KIND_CPU", max_queue_delay_us=settings.queue_delay_us
    )
    runtime = TorchRuntime(precision=precision, cuda_graphs=gpu, compiler="inductor", host_outputs=gpu, inprocess=True)
    request = BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=work, options=options)
    engine = build_torch_variant(request, runtime)["name"]
    python = ""
    if settings.python_too and gpu:
        python = build_torch_variant(request, dataclasses.replace(runtime, native=False))["name"]
    echo = _echo_variant(spec, work, repo, options, runtime)
    tokenizer = settings.tokenizer or _default_tokenizer()
    pipeline = ""
    if settings.text and tokenizer is not None:
        pipe_spec = dataclasses.replace(spec, name=engine)
        names = pipelines.write_text_pipeline(
            repo,
            pipe_spec,
            tokenizer,
            ServingOptions(max_queue_delay_us=settings.queue_delay_us),
            inprocess=True,
        )
        pipeline = next(n for n in names if n.endswith("_pipeline"))
    return spec, {"engine": engine, "pipeline": pipeline, "python": python, "echo": echo}


def _echo_variant(spec, work: Path, repo: Path, options, runtime) -> str:
    """The echo of spec (builders/spec/zoo/echo.py: each row's first token id, an engine that does nothing) built
    and served like the engine: what serving a sentence costs on this host, beside the engine's own figure."""
    from tpserve.builders.build import build_model, build_torch_variant
    from tpserve.builders.request import BuildRequest
    from tpserve.builders.spec.zoo import echo

    twin = echo.spec_like(spec)
    build_model(BuildRequest(spec=twin, target="embedded", repo=work / "scratch_repo", work_dir=work))
    request = BuildRequest(spec=twin, target="embedded", repo=repo, work_dir=work, options=options)
    return build_torch_variant(request, runtime)["name"]


def _default_tokenizer() -> Path | None:
    try:
        from tpserve.builders.spec.zoo.text import model_dir

        path = model_dir() / "tokenizer.json"
    except Exception:  # the minilm package is not installed here
        return None
    return path if path.exists() else None


def before_variant(spec, repo: Path, work: Path) -> str:
    """The ONNX variant as it was served before ragged batching: inputs without allow_ragged_batch, one instance
    (ONNX Runtime's threads: one a physical core)."""
    return onnx_variant(spec, repo, work, ragged=False, instances=1)


def onnx_variant(spec, repo: Path, work: Path, ragged: bool, instances: int) -> str:
    """The spec's ONNX model served again under another name: with or without batching across lengths, on one
    instance or several (the cores shared among them)."""
    from tpserve.builders.repository import writer as repository

    name = f"{spec.name}_{'ragged' if ragged else 'before'}" + (f"_x{instances}" if instances > 1 else "")
    variant = dataclasses.replace(spec, name=name)
    options = repository.ServingOptions(instances=instances, max_queue_delay_us=ONNX_QUEUE_DELAY_US)
    config = repository.model_config(variant, "embedded", options)
    inputs = [dataclasses.replace(t, ragged=ragged and t.ragged) for t in config.inputs]
    config = dataclasses.replace(config, inputs=inputs)
    repository.write_model(repo, variant, config, {"model.onnx": work / spec.name / "model.onnx"}, "embedded")
    return name


# --- served
PYTHON_PATH = "served ids, Python's per-batch path (native_path 0)"
ECHO = "served ids, echo: an engine that does nothing, served as the engine is (what serving costs here)"
LAYOUT_ROWS = (  # the CPU's "before and after" rows, the change in two parts: (models key, what the row says)
    ("before", "served ids, before (no batching across lengths, one instance)"),
    ("after", "served ids, after (same model, ONNX Runtime: batching across lengths, two instances)"),
    ("before_x2", "served ids, before, two instances (the instance layout alone)"),
    ("ragged_x1", "served ids, after, one instance (batching across lengths alone)"),
    ("python", PYTHON_PATH),
)


class RaggedStats:
    """The runners' own statistics (padding efficiency, graph memory), written by the server's instances into
    a folder (TRITON_RAGGED_STATS), read as deltas around each point."""

    SETTLE_S = 1.3  # a little more than RaggedRunner.STATS_EVERY_S

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def read(self, model: str) -> dict:
        totals: dict = {}
        for path in self.folder.glob(f"{model}-*.json"):
            try:
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for key in ("rows", "real_tokens", "computed_tokens", "graph_bytes", "graphs", "batches", "requests"):
                totals[key] = totals.get(key, 0) + info.get(key, 0)
            for phase, seconds in info.get("timings_s", {}).items():
                totals[f"time:{phase}"] = totals.get(f"time:{phase}", 0.0) + seconds
        return totals


def _stats(ep, model: str) -> dict:
    return next(r for r in breakdown(ep, model) if r["model"] == model)


def _mean_batch(before: dict, after: dict) -> float | None:
    executions = after["executions"] - before["executions"]
    return (after["inferences"] - before["inferences"]) / executions if executions else None


def gpu_memory_mib() -> float | None:
    """GPU memory in use on the first GPU (nvidia-smi), or None without one."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    return float(done.stdout.split()[0]) if done.returncode == 0 and done.stdout.strip() else None


@dataclass(frozen=True, kw_only=True)
class Point:
    """One served point: which model, how many sentences per request, at which concurrency."""

    path: str
    model: str
    encoder: str  # the model whose statistics give the mean batch
    per_request: int
    concurrency: int
    words: tuple[str, ...] = tw.WORDS  # served text: the words its texts are made of
    zipf: float = 0.0  # ... drawn uniformly (0) or with weight 1 / rank**zipf
    interval_ms: int = 3000  # perf_analyzer's window; the client's runs last three of them
    protocol: str = "grpc"  # which of the server's endpoints serves it (in served_rows)


def describe_words(words: tuple[str, ...], zipf: float) -> str:
    """What texts are made of, for a report."""
    if words == tw.WORDS:
        return f"texts of {len(words)} words"
    return f"texts of {len(words):,} words of the tokenizer's vocabulary, Zipf {zipf:g}"


def served_point(point: Point, ep, analyzer, lengths: np.ndarray, label: str, stats: RaggedStats, raw: Path) -> TextRow:
    """One point on input data of the workload's shapes; the batch, padding and memory the server saw."""
    before, padding = _stats(ep, point.encoder), stats.read(point.encoder)
    steps_before = _step_stats(ep, point)
    tool = f"our {PROTOCOL_NAMES[ep.protocol]} client (requests made once)"  # cores of its own are ours to set
    if perf_can_send(point, lengths):
        tool = "perf_analyzer"
    what = f"{point.path} {point.model}, {point.per_request} per request, c{point.concurrency}"
    step(f"text-bench: {what} ({label}; {tool})")
    if tool == "perf_analyzer":
        measured = _perf_point(point, ep, analyzer, lengths, label, raw)
    else:
        measured = _client_point(point, ep, lengths)
    time.sleep(RaggedStats.SETTLE_S)  # the runners write their statistics every second
    after, padded = _stats(ep, point.encoder), stats.read(point.encoder)
    delta = {k: padded.get(k, 0) - padding.get(k, 0) for k in padded}
    seen = f"; the server saw {delta['real_tokens'] / delta['rows']:.1f} tokens per row" if delta.get("rows") else ""
    seen += _time_per_batch(delta)
    seen += _tokenize_step(steps_before, _step_stats(ep, point))
    words = f"; {describe_words(point.words, point.zipf)}" if point.path == "served text" else ""
    return TextRow(
        path=point.path,
        runtime=point.model,
        lengths=label,
        per_request=point.per_request,
        concurrency=point.concurrency,
        sentences_s=measured["throughput"],
        tokens_s=measured["throughput"] * float(np.mean(lengths)),
        p50_ms=measured["p50_ms"],
        p99_ms=measured["p99_ms"],
        mean_batch=_mean_batch(before, after),
        padding_efficiency=delta["real_tokens"] / delta["computed_tokens"] if delta.get("computed_tokens") else None,
        gpu_mib=gpu_memory_mib(),
        note=f"{ep.protocol}, {tool}; {measured['note']}{seen}{words}",
        extra={"measured": measured},
    )


def _step_stats(ep, point: Point) -> list[dict]:
    """Served text: Triton's statistics of the pipeline's steps other than the engine (the tokenize step)."""
    if point.path != "served text":
        return []
    return [r for r in breakdown(ep, point.model)[:-1] if r["model"] != point.encoder]


def _tokenize_step(before: list[dict], after: list[dict]) -> str:
    """What the tokenize step did in the point: its mean batch (requests and texts) and a request's ms in each
    phase (Triton gives every request of a batch the batch's compute times: they are the batch's)."""
    notes = []
    for old, new in zip(before, after):
        requests, executions = new["requests"] - old["requests"], new["executions"] - old["executions"]
        if not executions or not requests:
            continue
        texts = new["inferences"] - old["inferences"]
        phases = ", ".join(f"{phase} {_phase_ms(old, new, phase) / requests:.2f}" for phase in PHASES)
        notes.append(
            f"; {new['model']}: {requests / executions:.1f} requests ({texts / executions:.0f} texts) a batch, "
            f"a request's ms: {phases}"
        )
    return "".join(notes)


def _phase_ms(old: dict, new: dict, phase: str) -> float:
    """Total ms in a phase between two statistics rows (they hold µs per request and the request count)."""
    return (new[f"{phase}_us"] * new["requests"] - old[f"{phase}_us"] * old["requests"]) / 1e3


def _time_per_batch(delta: dict) -> str:
    """Where a batch's time went in the server (ms per batch, summed over instances), from the runner's stats;
    the native path's steps in µs per request too."""
    batches, requests = delta.get("batches", 0), delta.get("requests", 0)
    phases = {k.removeprefix("time:"): v for k, v in delta.items() if k.startswith("time:") and v}
    if not batches or not phases:
        return ""
    said = "; ms per batch: " + ", ".join(f"{phase} {1e3 * v / batches:.2f}" for phase, v in phases.items())
    native = {k.removeprefix("native: "): v for k, v in phases.items() if k.startswith("native: ")}
    if requests and native:
        said += "; native µs per request: " + ", ".join(f"{k} {1e6 * v / requests:.1f}" for k, v in native.items())
    return said


def perf_can_send(point: Point, lengths: np.ndarray) -> bool:
    """Where perf_analyzer measures the workload as it is: every sentence one length.

    perf_analyzer builds a request of batch b from b consecutive entries of one shape, and its concurrent
    contexts walk the entries in step: at concurrency c the server gets c requests of the same lengths at
    once, which Triton batches even without ragged batching (measured: a mean batch of 8 at concurrency 16
    where requests of mixed lengths give 1). Varied lengths therefore go through our client, whose users
    each start at another request.
    """
    return len(set(lengths.tolist())) == 1


def _perf_point(point: Point, ep, analyzer, lengths, label, raw: Path) -> dict:
    from tpserve.loadtest.perf.sweep import Sweep, run_sweep

    text = point.path == "served text"
    name = f"{point.model}_{point.per_request}_{'fixed' if len(set(lengths.tolist())) == 1 else 'varied'}.json"
    data = tw.perf_input_data(lengths, point.per_request, raw / name, text=text, words=(point.words, point.zipf))
    sweep = Sweep(
        point.model,
        concurrency=(point.concurrency,),
        batch_sizes=(point.per_request,),
        measurement_ms=point.interval_ms,
        max_trials=6,
        stability_percent=25,
        input_data=data,
    )
    (row,) = run_sweep(sweep, ep, analyzer, raw)
    note = f"stable={row['stable']}; queue {row['queue_us']:.0f} µs, infer {row['compute_infer_us']:.0f} µs"
    return {**row, "note": note}


def _client_point(point: Point, ep, lengths, processes: int = 0) -> dict:
    from tpserve.loadtest.workloads import ragged_load

    with ep.client() as client:
        meta = _metadata(client, point.model)
    if point.path == "served text":
        made = [
            {
                "TEXT": np.array(
                    [[t.encode()] for t in tw.texts(lengths[i : i + point.per_request], i, point.words, point.zipf)],
                    dtype=object,
                )
            }
            for i in range(0, len(lengths) - point.per_request + 1, point.per_request)
        ]
    else:
        names = [i["name"] for i in meta["inputs"]]
        made = [tw.token_arrays(names, ids, mask) for ids, mask in tw.requests(lengths, point.per_request)]
    outputs = [o["name"] for o in meta["outputs"]]
    if ep.protocol == "http":
        payloads = ragged_load.serialize_http(point.model, made, outputs, ep.url, ep.headers)
    else:
        payloads = ragged_load.serialize(point.model, made, outputs)
    seconds = point.interval_ms / 1000 * 3
    rows = [point.per_request] * len(payloads)
    result = ragged_load.run(
        ep.url, payloads, rows, point.concurrency, seconds, processes=processes, protocol=ep.protocol
    )
    client = client_load(result)
    note = f"{result.requests} requests in {result.seconds:g} s, {result.errors} failed; {client}"
    figures = {"throughput": result.rows_per_s, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms}
    return {**figures, "note": note, "client": client}


def client_load(result) -> str:
    """How busy the client was: its busiest process in cores, and whether that may have set the pace."""
    processes = f"{result.processes} process" + ("es" if result.processes > 1 else "")
    said = f"the client's {processes}, the busiest {result.client_busy:.2f} of a core"
    return said + (" (client-bound: the server may serve more)" if result.client_bound else "")


def _metadata(client, model: str) -> dict:
    from tpserve.clients.connection import as_dict

    meta = client.get_model_metadata(model)
    return meta if isinstance(meta, dict) else as_dict(meta)


def served_rows(
    settings, eps: dict, analyzer, models: dict, lengths: np.ndarray, label: str, stats, raw: Path, direct=None
) -> Iterator[TextRow]:
    """Every served point of one length distribution: ids (per_request and single sentences, these over gRPC and
    HTTP), text, before. eps: the served Endpoint per protocol (gRPC's unless a point says); direct: a plain
    server's, measured after each point and reported beside it (None: not). Yields each row as it is measured."""
    window = settings.interval_ms
    engine = models["engine"]
    points = [
        Point(
            path="served ids",
            model=engine,
            encoder=engine,
            per_request=settings.per_request,
            concurrency=c,
            interval_ms=window,
        )
        for c in settings.concurrency
    ]
    points += [
        Point(
            path="served ids",
            model=engine,
            encoder=engine,
            per_request=1,
            concurrency=c,
            interval_ms=window,
            protocol=protocol,
        )
        for c in settings.single_concurrency
        for protocol in SINGLE_PROTOCOLS
    ]
    if models.get("pipeline"):
        words, zipf = text_words(settings)
        points += [
            Point(
                path="served text",
                model=models["pipeline"],
                encoder=engine,
                per_request=settings.per_request,
                concurrency=c,
                words=words,
                zipf=zipf,
                interval_ms=window,
            )
            for c in settings.concurrency[-1:]
        ]
    for key, path in (*LAYOUT_ROWS, ("echo", ECHO)):
        if models.get(key):
            points += [
                Point(
                    path=path,
                    model=models[key],
                    encoder=models[key],
                    per_request=1,
                    concurrency=c,
                    interval_ms=window,
                    protocol=protocol,
                )
                for c in settings.single_concurrency[:1]
                for protocol in (SINGLE_PROTOCOLS if key == "echo" else ("grpc",))
            ]
    for point in points:
        yield _beside(point, eps, direct, analyzer, lengths, label, stats, raw)


def _beside(point, eps: dict, direct: dict | None, analyzer, lengths, label, stats, raw) -> TextRow:
    """The point as `server start` serves (the default path's figure), then on a plain server: its sentences/s
    and p50 go beside the served one's in the same row."""
    row = _safe_point(point, eps[point.protocol], analyzer, lengths, label, stats, raw)
    if direct is not None:
        alone = _safe_point(point, direct[point.protocol], analyzer, lengths, label, stats, raw / "direct")
        row.direct_sentences_s, row.direct_p50_ms = alone.sentences_s, alone.p50_ms
    return row


def _safe_point(point, ep, analyzer, lengths, label, stats, raw) -> TextRow:
    """served_point, where a point that fails is a row saying why: the others still run."""
    try:
        return served_point(point, ep, analyzer, lengths, label, stats, raw)
    except Exception as err:  # perf_analyzer, the client or the server: the report says which and why
        first = str(err).strip().splitlines()
        reason = next((line for line in first if "rror" in line), first[0] if first else type(err).__name__)
        return TextRow(
            path=point.path,
            runtime=point.model,
            lengths=label,
            per_request=point.per_request,
            concurrency=point.concurrency,
            note=f"failed: {reason[:300]}",
        )


def accuracy_rows(ep, models: dict, reference, tokenizer: Path | None, label: str) -> list[TextRow]:
    """Every sentence of the zoo's list embedded by the served engine (from ids) and the pipeline (from text),
    against the fp32 eager module on the CPU: the smallest cosine. A tokenizer is needed for real ids."""
    import torch
    from tokenizers import Tokenizer

    from tpserve.builders.spec.zoo.text import SENTENCES
    from tpserve.clients.infer import infer

    if tokenizer is None:
        return [
            TextRow(path="accuracy", runtime=models["engine"], lengths=label, note="no tokenizer.json: not checked")
        ]
    tok = Tokenizer.from_file(str(tokenizer))
    tok.enable_truncation(256)
    tok.enable_padding()
    encodings = tok.encode_batch(list(SENTENCES))
    ids = np.array([e.ids for e in encodings], np.int64)
    mask = np.array([e.attention_mask for e in encodings], np.int64)
    with torch.inference_mode():
        expected = reference(torch.from_numpy(ids), torch.from_numpy(mask)).float().numpy()
    served = {"served ids": infer(ep, models["engine"], {"input_ids": ids, "attention_mask": mask})}
    if models.get("pipeline"):
        texts = np.array([[t.encode()] for t in SENTENCES], dtype=object)
        served["served text"] = infer(ep, models["pipeline"], {"TEXT": texts})
    rows = []
    for path, result in served.items():
        got = next(iter(result.outputs.values()))
        cosine = np.sum(got * expected, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
        rows.append(
            TextRow(
                path="accuracy",
                runtime=models["engine"] if path == "served ids" else models["pipeline"],
                lengths=f"{len(SENTENCES)} sentences of builders/spec/zoo/text.py",
                note=f"{path} vs the fp32 eager module on the CPU: min cosine {cosine.min():.5f}, "
                f"mean {cosine.mean():.5f}",
                extra={"min_cosine": float(cosine.min())},
            )
        )
    return rows


def latency_rows(settings, eps: dict, analyzer, models: dict, stats, raw: Path, direct=None) -> list[TextRow]:
    """One 32-token sentence per request, concurrency 1: p50 from ids and from text, over gRPC and over HTTP;
    as served (eps), a plain server's (direct) beside."""
    one = tw.Lengths(fixed=32).sample(256)
    label = "one sentence of 32 tokens"
    window = settings.interval_ms
    points = [
        Point(
            path="served ids",
            model=models["engine"],
            encoder=models["engine"],
            per_request=1,
            concurrency=1,
            interval_ms=window,
        )
    ]
    if models.get("pipeline"):
        words, zipf = text_words(settings)
        points.append(
            Point(
                path="served text",
                model=models["pipeline"],
                encoder=models["engine"],
                per_request=1,
                concurrency=1,
                words=words,
                zipf=zipf,
                interval_ms=window,
            )
        )
    for key, path in (("echo", ECHO), ("python", PYTHON_PATH)):
        if not models.get(key):
            continue
        other = models[key]
        points.append(Point(path=path, model=other, encoder=other, per_request=1, concurrency=1, interval_ms=window))
    over = [dataclasses.replace(p, protocol=protocol) for p in points for protocol in ("grpc", "http")]
    return [_beside(p, eps, direct, analyzer, one, label, stats, raw) for p in over]


def run(settings: TextBenchSettings, out: Path) -> list[TextRow]:
    """Build, measure in-process, serve, measure served; write text_bench.{md,csv,json,png} under out."""
    import torch

    from tpserve.loadtest.perf.tools import find_perf_analyzer
    from tpserve.server.fronts import served_as_started
    from tpserve.server.triton.launcher import TritonTuning

    gpu = torch.cuda.is_available()
    settings = for_device(settings, gpu)
    work, repo = out / "work", out / "repo"
    spec, models = build(settings, work, repo, gpu)
    if settings.before and not gpu:
        models.update(before=before_variant(spec, repo, work), after=spec.name)
        models["before_x2"] = onnx_variant(spec, repo, work, ragged=False, instances=2)
        models["ragged_x1"] = onnx_variant(spec, repo, work, ragged=True, instances=1)
    workloads = [tw.Lengths.parse(text, longest=spec.longest_sequence()) for text in settings.lengths]
    rows = inprocess(settings, spec, work, gpu, workloads)
    _write(rows, out, settings, spec)
    stats = RaggedStats(out / "ragged_stats")
    analyzer = find_perf_analyzer()
    tuning = TritonTuning(latency_summaries=settings.latency_summaries)
    serving = served_as_started(
        repo, out / "state", direct=settings.direct, startup_timeout=900, ragged_stats=stats.folder, tuning=tuning
    )
    with serving as (state, inner):  # as `server start` serves, a plain server's figure beside
        eps = {protocol: state.endpoint(protocol, repo) for protocol in PROTOCOLS}
        direct = {protocol: inner.endpoint(protocol, repo) for protocol in PROTOCOLS} if inner else None
        ep = eps["grpc"]
        reference = _reference(work / spec.name / "model.pt2")
        rows += accuracy_rows(ep, models, reference, settings.tokenizer or _default_tokenizer(), "")
        rows += latency_rows(settings, eps, analyzer, models, stats, out / "raw", direct)
        _write(rows, out, settings, spec)
        for workload in workloads:
            lengths = workload.sample(settings.sentences)
            measured = served_rows(
                settings, eps, analyzer, models, lengths, workload.describe(), stats, out / "raw", direct
            )
            for row in measured:
                rows.append(row)
                _write(rows, out, settings, spec)  # as results come: a run cut short keeps what it measured
        _keep_metrics(state, out / "metrics.txt")
    return rows


def _keep_metrics(state, path: Path) -> None:
    """The server's Prometheus metrics as the run leaves them (counters, the backend's latency histogram, the
    summaries where on), beside the report."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{state.host}:{state.metrics_port}/metrics", timeout=10) as answer:
            path.write_bytes(answer.read())
    except OSError as err:  # the report stands without them
        path.write_text(f"# the metrics could not be read: {err}\n")


def _reference(program: Path):
    """The exported module in fp32 on the CPU: what served embeddings are compared with."""
    from tpserve.triton_models.runtime import torch_runtime as rt

    return rt.load_program(program).float()


def inprocess(settings, spec, work: Path, gpu: bool, workloads) -> list[TextRow]:
    """Eager baselines and the served engine's runner, per workload, and one 32-token sentence."""
    import torch

    from tpserve.builders.formats.torch_compiled import ragged_engine
    from tpserve.builders.repository.writer import TorchRuntime
    from tpserve.triton_models.runtime import torch_runtime as rt

    device = "cuda" if gpu else "cpu"
    precision = settings.precision or ("fp16" if gpu else "fp32")
    program = work / spec.name / "model.pt2"
    module = rt.load_program(program, device).to(device, dtype=rt.DTYPES[precision])
    runtime = TorchRuntime(precision=precision, cuda_graphs=gpu, compiler="inductor")
    step(f"text-bench: compiling the served engine in-process ({precision}, {device})")
    runner = ragged_engine(
        rt.compiled(rt.load_program(program, device).to(device, dtype=rt.DTYPES[precision])), spec, runtime, device
    ).runner
    rows = []
    for workload in workloads:
        lengths, label = workload.sample(settings.sentences), workload.describe()
        rows += eager_rows(module, lengths, label, settings.batch, device, spec.longest_sequence())
        rows += runner_rows(runner, lengths, label, settings.batch)
        if spec.max_batch_size > settings.batch:  # what one dynamic batch of the served model can hold
            rows += runner_rows(runner, lengths, label, spec.max_batch_size)[1:]
    rows += tokenizer_rows(settings, workloads)
    eager_ms, engine_ms = single_sentence_ms(runner, module, device)
    label = "one sentence of 32 tokens"
    rows.append(TextRow(path="in-process", runtime="eager", lengths=label, per_request=1, p50_ms=eager_ms))
    rows.append(
        TextRow(path="in-process", runtime="served engine (runner)", lengths=label, per_request=1, p50_ms=engine_ms)
    )
    del runner, module
    if gpu:
        torch.cuda.empty_cache()
    return rows


# --- report
def markdown(rows: list[TextRow], header: str) -> str:
    fmt = lambda v, f: "—" if v is None else format(v, f)  # noqa: E731
    lines = [
        header,
        "",
        "| path | runtime / model | lengths | sentences per request | concurrency | sentences/s | tokens/s | p50 ms "
        "| p99 ms | a plain server (no front): sentences/s, p50 ms | mean batch (rows) | padding efficiency "
        "| GPU MiB | note |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        lines.append(
            f"| {r.path} | {r.runtime} | {r.lengths} | {r.per_request or '—'} "
            f"| {r.concurrency or '—'} | "
            f"{fmt(r.sentences_s, ',.0f')} | {fmt(r.tokens_s, ',.0f')} | {fmt(r.p50_ms, '.2f')} | "
            f"{fmt(r.p99_ms, '.2f')} | {_direct(r)} | "
            f"{fmt(r.mean_batch, '.1f')} | {fmt(r.padding_efficiency, '.2f')} | {fmt(r.gpu_mib, ',.0f')} | {r.note} |"
        )
    return "\n".join(lines)


def _direct(row: TextRow) -> str:
    if row.direct_sentences_s is None and row.direct_p50_ms is None:
        return "—"
    rate = "—" if row.direct_sentences_s is None else f"{row.direct_sentences_s:,.0f}"
    p50 = "—" if row.direct_p50_ms is None else f"{row.direct_p50_ms:.2f}"
    return f"{rate}, {p50}"


def plot(rows: list[TextRow], path: Path) -> Path:
    """Bars: sentences/s of every throughput row (in-process blue, served orange), one line of label each."""
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    measured = [r for r in rows if r.sentences_s and not (r.per_request == 1 and r.concurrency <= 1)]  # no latency
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(measured) + 1.2))
    ax.barh(
        range(len(measured)),
        [r.sentences_s for r in measured],
        color=["C0" if r.path == "in-process" else "C1" for r in measured],
    )
    ax.set_yticks(range(len(measured)), [_label(r) for r in measured], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("sentences/s (blue: in-process, orange: served)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


def _label(row: TextRow) -> str:
    workload = "32 tokens" if row.lengths.startswith("all 32") else row.lengths.split(",")[0]
    served = f", {row.per_request}/request, c{row.concurrency}" if row.path != "in-process" else ""
    runtime = row.runtime if row.path == "in-process" else row.path.split(":")[0].split(" (")[0]  # its short name
    return f"{runtime}{served} [{workload}]"


def rows_from_csv(path: Path) -> list[TextRow]:
    """TextRows back from text_bench.csv (to re-plot a run made elsewhere)."""
    import csv

    numbers = {f.name for f in dataclasses.fields(TextRow)} - {"path", "runtime", "lengths", "note", "extra"}
    with open(path, newline="") as handle:
        records = list(csv.DictReader(handle))
    parse = lambda k, v: (float(v) if v else None) if k in numbers else v  # noqa: E731
    fields: list[dict[str, Any]] = [{k: parse(k, v) for k, v in r.items()} for r in records]
    rows = [TextRow(**f) for f in fields]
    for row in rows:
        row.per_request, row.concurrency = int(row.per_request or 0), int(row.concurrency or 0)
    return rows


def _write(rows, out: Path, settings: TextBenchSettings, spec) -> None:
    import csv

    from tpserve.builders.environment import host_info, tool_versions

    out.mkdir(parents=True, exist_ok=True)
    host = host_info()
    header = (
        f"# {spec.name}: text in-process and served\n\nHost: {host['gpu']}, {host['cpu']} ({host['cores']} cores); "
        f"versions {tool_versions()}; settings {dataclasses.asdict(settings)}"
    )
    (out / "text_bench.json").write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=2, default=str))
    with open(out / "text_bench.csv", "w", newline="") as handle:
        names = [f.name for f in dataclasses.fields(TextRow) if f.name != "extra"]
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: v for k, v in dataclasses.asdict(r).items() if k != "extra"})
    write_report(rows, out, header)


def write_report(rows: list[TextRow], out: Path, header: str) -> Path:
    """text_bench.png, text_bench.md and text_bench.html in out; returns the markdown's path."""
    try:
        plot(rows, out / "text_bench.png")
    except (ImportError, ValueError) as err:
        step(f"text-bench: no plot ({err})")
    figure = "\n\n![sentences/s by path and load](text_bench.png)" if (out / "text_bench.png").exists() else ""
    (out / "text_bench.md").write_text(markdown(rows, header) + figure + "\n")
    write_html(out / "text_bench.md")
    return out / "text_bench.md"
