"""Compiled engines: the exported program through torch.compile (inductor), built ahead of time.

Like a TensorRT plan, a compiled engine is an artifact of `make build-engines`, made on the
kind of host that serves it: the build compiles the model's torch.export program for the
runtime's precision on the instance's device (one graph for batch 1, one with a dynamic batch
axis for the rest), captures the CUDA-graph buckets, gates the result against the fp32 eager
module on the spec's shape cases, and saves inductor's portable compile artifacts
(torch.compiler.save_cache_artifacts) as compile_cache.bin beside model.pt2. The server's
model.py loads them before compiling, so a cold start reuses the build's kernels instead of
compiling from scratch. A variant that fails the gate is not written.

Why not an AOTInductor package: see docs/benchmarks.md ("Compiled engines"): packages built on
the H100 segfaulted in AOTIModelPackageLoader on load (CPU and CUDA packages alike).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path

from tpserve.builders.checks import validate
from tpserve.builders.environment import gpu_info
from tpserve.builders.formats import export
from tpserve.builders.repository import manifest
from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.writer import ragged_inputs
from tpserve.common.cli import step
from tpserve.common.errors import ExportError, SpecError

CACHE = "compile_cache.bin"
REPORT = "validation.compiled.json"


def compiler_versions() -> dict:
    """What a compiled engine depends on: torch and triton-lang (the kernels' compiler)."""
    versions: dict[str, str | None] = {}
    for name in ("torch", "triton"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_for(kind: str) -> str:
    """'cuda' for GPU instances (a GPU must be present: engines are compiled for it), 'cpu' for CPU ones."""
    import torch

    if kind == "KIND_CPU":
        return "cpu"
    if not torch.cuda.is_available():
        raise SpecError(
            f"a compiled engine for {kind} instances is built on the GPU host that serves it (its kernels are "
            "compiled for that GPU and torch), and torch sees no CUDA GPU here; run the build there, or build "
            "the engine for KIND_CPU instances"
        )
    return "cuda"


@contextlib.contextmanager
def fresh_compile_cache():
    """A private, empty inductor/triton cache for the build, so the saved artifacts hold every kernel."""
    import torch

    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="inductor-build-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"] = tmp, os.path.join(tmp, "triton")
        torch.compiler.reset()
        try:
            yield
        finally:
            torch.compiler.reset()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def compile_engine(program: Path, spec, runtime: repository.TorchRuntime, device: str):
    """(runner, seconds): the program compiled and warmed on every batch bucket, as the server will run it."""
    import torch

    from tpserve.triton_models.runtime import torch_runtime as rt

    dtype = rt.DTYPES[runtime.precision]
    fmt = torch.channels_last if runtime.channels_last else torch.contiguous_format
    module = rt.load_program(program, device).to(device, dtype=dtype, memory_format=fmt)  # type: ignore[call-overload]  # Module.to takes memory_format with the others
    started = time.time()
    engine = rt.compiled(module)
    fixed = all(-1 not in t.dims for t in spec.inputs)
    with torch.inference_mode():
        if fixed:
            buckets = rt.bucket_sizes(spec.max_batch_size, runtime.graph_batch_sizes)
            samples = [_sample(t, dtype) for t in spec.inputs]
            (shape, kind), *others = samples
            graphs = rt.GraphRunner(engine, shape, kind, device, buckets, runtime.channels_last, others)
            runner = graphs if runtime.cuda_graphs and device == "cuda" else engine
            if runner is engine:  # GraphRunner compiled nothing on the CPU: warm the compiled graphs here
                for size in buckets:
                    graphs(*[torch.zeros((size, *dims), dtype=of, device=device) for dims, of in samples])
        elif ragged_inputs(spec):
            runner = ragged_engine(engine, spec, runtime, device)
        else:
            runner = engine
            for batch, lengths in validate.shape_cases(spec):
                feeds = export.sample_inputs(spec, batch, lengths=lengths)
                engine(*[_prepared(torch.from_numpy(feeds[t.name]), device, dtype, runtime) for t in spec.inputs])
    return runner, round(time.time() - started, 1)


def ragged_engine(engine, spec, runtime: repository.TorchRuntime, device: str):
    """A sequence model's engine as the server runs it: rows grouped by length, CUDA graphs over the grid's
    (rows x length) cells on a GPU (triton_models/runtime/ragged_runner.py). Called like the module, one request."""
    import torch

    from tpserve.triton_models.runtime import ragged
    from tpserve.triton_models.runtime.ragged_runner import for_spec
    from tpserve.triton_models.runtime.torch_serving import TORCH_DTYPES

    grid = ragged.default_grid(
        spec.longest_sequence(),
        spec.max_batch_size,
        runtime.token_budget,
        runtime.length_buckets,
        runtime.graph_batch_sizes,
    )
    names = [t.name for t in spec.inputs]
    out_dtypes = [TORCH_DTYPES.get(f"TYPE_{t.dtype}", torch.float32) for t in spec.outputs]
    graphs = runtime.cuda_graphs and device == "cuda"
    runner = for_spec(engine, spec.to_dict(), grid, device, out_dtypes, graphs, spec.name)
    if graphs:
        info = runner.describe()
        step(
            f"{spec.name}: {info['graphs']} CUDA graphs over lengths {info['length_buckets']} x batches up to "
            f"{info['batch_buckets'][-1]} (token budget {info['token_budget']}): "
            f"{info['graph_bytes'] / 2**20:.0f} MiB, captured in {info['capture_seconds']} s"
        )

    def run(*tensors):
        feed = {n: t.detach().cpu().numpy() for n, t in zip(names, tensors)}
        (outputs,) = runner(ragged.RaggedBatch([feed], names, runner.mask))
        return tuple(torch.from_numpy(o).to(device) for o in outputs)

    run.describe, run.runner = runner.describe, runner  # type: ignore[attr-defined]  # what the gate reports
    return run


def _sample(tensor, dtype) -> tuple:
    """An input's per-sample shape and the dtype the engine takes it in (floats in the precision)."""
    from tpserve.triton_models.runtime.torch_runtime import TORCH_DTYPES

    kind = TORCH_DTYPES[f"TYPE_{tensor.dtype}"]
    return tuple(tensor.dims), dtype if kind.is_floating_point else kind


def _prepared(tensor, device, dtype, runtime):
    import torch

    tensor = tensor.to(device)
    if tensor.is_floating_point():
        tensor = tensor.to(dtype)
        if runtime.channels_last and tensor.dim() == 4:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def _gate(runner, program: Path, spec, runtime, device: str, report_path: Path) -> dict:
    """The engine at its precision against the fp32 eager program, on the spec's shape cases."""
    import torch

    from tpserve.triton_models.runtime import torch_runtime as rt

    reference = rt.load_program(program, device).to(device)
    dtypes = [getattr(torch, {"FP32": "float32", "FP16": "float16"}.get(t.dtype, "float32")) for t in spec.outputs]

    def fp32(*inputs):
        return reference(*[x.to(device) for x in inputs])

    def engine(*inputs):
        with torch.inference_mode():
            out = runner(*[_prepared(x, device, rt.DTYPES[runtime.precision], runtime) for x in inputs])
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(o.to(d) if o.is_floating_point() else o for o, d in zip(out, dtypes))

    what = f"inductor {runtime.precision} engine"
    return validate.validate_torch(fp32, engine, spec, runtime.precision, report_path, what)


def _compile_step(program: Path, spec, runtime, device: str, name: str):
    """compile_engine, where a failure of the compiler is an ExportError naming the model and the step."""
    try:
        return compile_engine(program, spec, runtime, device)
    except (SpecError, KeyboardInterrupt):
        raise
    except Exception as err:  # dynamo/inductor raise many kinds; the user needs the model, the step and why
        lines = [line.strip() for line in str(err).strip().splitlines()]
        cause = next((line for line in lines[1:] if line.startswith("Explanation:")), "")
        first = "; ".join(x for x in (lines[0] if lines else "", cause) if x)[:600]
        raise ExportError(
            f"{spec.name}: compiling {name} (torch.compile/inductor, {runtime.precision}, {device}) failed: "
            f"{type(err).__name__}: {first}; build without --compiled, or rerun with TORCH_LOGS=+dynamo for the "
            "compiler's trace"
        ) from err


def build_compiled_variant(req, runtime: repository.TorchRuntime) -> dict:
    """Compile, gate and write <model>_inductor_<precision>[...] into the repository; return its manifest entry."""
    import torch

    from tpserve.builders.formats.torch_variant import write_torch_variant

    if not runtime.compiler:
        raise SpecError("build_compiled_variant needs a runtime with compiler='inductor'")
    device = device_for(req.options.kind)
    out_dir = req.work_dir / req.spec.name
    program = out_dir / "model.pt2"
    if not program.exists():
        raise SpecError(f"{req.spec.name}: no torch.export program (model.pt2) in {out_dir}; build the model first")
    name = runtime.variant(req.spec.name)
    step(f"{req.spec.name}: compiling {name} (torch.compile/inductor, {runtime.precision}, {device})")
    with fresh_compile_cache():
        runner, seconds = _compile_step(program, req.spec, runtime, device, name)
        step(f"{req.spec.name}: compiled in {seconds} s; validating against the fp32 eager module")
        report = _gate(runner, program, req.spec, runtime, device, out_dir / f"{name}.{REPORT}")
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise ExportError(f"{req.spec.name}: torch.compile saved no cache artifacts for {name}; build it again")
        blob, _ = saved
    cache = out_dir / f"{name}.{CACHE}"
    cache.write_bytes(blob)
    compiled = {
        "compiler": "inductor",
        **compiler_versions(),
        "device": device,
        "gpu": gpu_info() if device == "cuda" else None,
        "compile_seconds": seconds,
        "cache_bytes": len(blob),
    }
    if device == "cuda":
        compiled["compute_capability"] = compiled["gpu"]["compute_capability"]
    if hasattr(runner, "describe"):
        info = runner.describe()
        keys = ("length_buckets", "batch_buckets", "token_budget", "graphs", "graph_bytes", "capture_seconds")
        compiled["ragged"] = {k: info[k] for k in keys}
    entry = write_torch_variant(req, runtime, {CACHE: cache})
    worst = max((s["max_abs"] for b in report["batches"] for s in b["outputs"].values()), default=0.0)
    validation = {"passed": True, "max_abs_error": worst, "atol": report["atol"], "rtol": report["rtol"]}
    validation["outputs"] = report["outputs"]  # every output's agreement figures against fp32 (the worst case)
    entry = dataclasses.replace(entry, compiled=compiled, validation={**validation, "reference": "pytorch fp32 eager"})
    manifest.update_manifest(req.repo, entry)
    return entry.to_dict()
