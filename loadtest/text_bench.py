"""Text models measured like the image models: the in-process ceiling, served from token ids, served from text.

One run builds a sequence model (a spec-file encoder; pooling in the engine), then measures, for each length
distribution (seeded lognormal, and all sentences at 32 tokens):
- in-process: eager with every batch padded to the longest length, eager sorted by length with each batch
  padded to its own longest (sentence-transformers' way), and the served engine's own runner (compiled, CUDA
  graphs over the same length and batch buckets on a GPU) on the same sentences;
- served from token ids: perf_analyzer, 32 sentences per request over a concurrency sweep, and single-sentence
  requests at high concurrency; the mean batch from Triton's statistics, padding efficiency and graph memory
  from the runner's own statistics (TRITON_RAGGED_STATS);
- served from raw text through <model>_pipeline (tokenize step batched, encoder pooled);
- one 32-token sentence, batch 1: p50 from ids and from text.
Every row names the shapes it was measured with. On a host without a GPU the same rows run on the CPU, with
"before" rows: the same model served as it was before ragged batching (requests of different lengths never
share a batch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.cli import step
from loadtest import text_workload as tw


@dataclass(frozen=True)
class TextBenchSettings:
    """What the text bench builds and how hard it pushes."""

    spec_file: Path = Path("examples/text/models.toml")
    model: str = "minilm_l6_random"
    lengths: tuple[str, ...] = ("lognormal", "fixed:32")
    sentences: int = 8192
    batch: int = 256  # in-process batch (sentences per run)
    per_request: int = 32
    concurrency: tuple[int, ...] = (4, 8, 16)  # requests of per_request sentences
    single_concurrency: tuple[int, ...] = (16, 256)  # single-sentence requests
    interval_ms: int = 3000
    precision: str = ""  # "": fp16 on a GPU, fp32 on a CPU
    tokenizer: Path | None = None  # tokenizer.json for the text rows (default: the minilm package's)
    instances: int = 1
    before: bool = True  # CPU: also serve the model as it was before ragged batching
    text: bool = True  # the rows served from raw text


@dataclass
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
    return sum(len(rows) * (width or int(lengths[rows].max())) for rows in np.array_split(order, range(batch, len(order), batch)))


def _inproc_row(name, label, count, real, seconds, efficiency, note="") -> TextRow:
    return TextRow(
        "in-process", name, label, sentences_s=count / seconds, tokens_s=real / seconds,
        padding_efficiency=efficiency, note=note,
    )


def runner_rows(runner, lengths: np.ndarray, label: str, batch: int) -> list[TextRow]:
    """The served engine's runner in-process: sorted sentences in batches, and batches in arrival order."""
    from triton_models import ragged

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
            batches.append(ragged.RaggedBatch([{"input_ids": ids[picked, :width], "attention_mask": mask[picked, :width]}], ["input_ids", "attention_mask"], "attention_mask"))

        def run():
            for b in batches:
                runner(b)

        before = dataclasses.replace(runner.counters)
        step(f"text-bench: in-process served engine, {name} ({label})")
        seconds = _timed(run, runs=3)
        done = runner.counters
        efficiency = (done.real_tokens - before.real_tokens) / max(done.computed_tokens - before.computed_tokens, 1)
        info = runner.describe()
        note = f"{info['graphs']} graphs, lengths {info['length_buckets']}, token budget {info['token_budget']}"
        rows.append(_inproc_row(f"served engine in-process ({name})", label, len(lengths), real, seconds, efficiency, note))
        rows[-1].gpu_mib = info["graph_bytes"] / 2**20 if info["graphs"] else None
    return rows


def single_sentence_ms(runner, module, device: str, length: int = 32) -> tuple[float, float]:
    """One sentence of `length` tokens: eager module, and the served engine's runner (median ms)."""
    import torch

    from triton_models import ragged

    ids, mask = tw.token_rows(np.array([length]))
    a, m = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
    batch = ragged.RaggedBatch([{"input_ids": ids, "attention_mask": mask}], ["input_ids", "attention_mask"], "attention_mask")

    def eager():
        with torch.inference_mode():
            module(a, m)

    return _median_ms(eager), _median_ms(lambda: runner(batch))


# --- build
def build(settings: TextBenchSettings, work: Path, repo: Path, gpu: bool):
    """The spec's model built into repo: the ONNX variant and the compiled engine (in-process backend), the text
    pipeline where a tokenizer is found; returns (spec, engine name, pipeline name or "")."""
    from builders.build import build_model, build_torch_variant
    from builders.repository import pipelines
    from builders.repository.writer import ServingOptions, TorchRuntime
    from builders.request import BuildRequest
    from builders.spec import spec_file

    found = {m.spec.name: m for m in spec_file.load(settings.spec_file)}
    if settings.model not in found:
        from common.errors import MeasurementError

        raise MeasurementError(f"{settings.spec_file} has no model {settings.model!r}; it has {sorted(found)}")
    spec = found[settings.model].spec
    cpu = ServingOptions(max_queue_delay_us=500)
    build_model(BuildRequest(spec, "embedded", repo, work, cpu))
    precision = settings.precision or ("fp16" if gpu else "fp32")
    options = ServingOptions(
        instances=settings.instances, kind="KIND_GPU" if gpu else "KIND_CPU", max_queue_delay_us=500
    )
    runtime = TorchRuntime(precision, cuda_graphs=gpu, compiler="inductor", host_outputs=gpu, inprocess=True)
    engine = build_torch_variant(BuildRequest(spec, "embedded", repo, work, options), runtime)["name"]
    tokenizer = settings.tokenizer or _default_tokenizer()
    pipeline = ""
    if settings.text and tokenizer is not None:
        pipe_spec = dataclasses.replace(spec, name=engine)
        names = pipelines.write_text_pipeline(repo, pipe_spec, tokenizer, ServingOptions(max_queue_delay_us=500))
        pipeline = next(n for n in names if n.endswith("_pipeline"))
    return spec, engine, pipeline


def _default_tokenizer() -> Path | None:
    try:
        from builders.spec.zoo.text import model_dir

        path = model_dir() / "tokenizer.json"
    except Exception:  # the minilm package is not installed here
        return None
    return path if path.exists() else None


def before_variant(spec, repo: Path, work: Path) -> str:
    """The ONNX variant as it was served before ragged batching: inputs without allow_ragged_batch."""
    from builders.repository import writer as repository

    name = f"{spec.name}_before"
    variant = dataclasses.replace(spec, name=name)
    config = repository.model_config(variant, "embedded", repository.ServingOptions(max_queue_delay_us=500))
    inputs = [dataclasses.replace(t, ragged=False) for t in config.inputs]
    config = dataclasses.replace(config, inputs=inputs)
    repository.write_model(repo, variant, config, {"model.onnx": work / spec.name / "model.onnx"}, "embedded")
    return name
