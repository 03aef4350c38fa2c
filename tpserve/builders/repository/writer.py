"""The Triton model repository writer: model folders with config.pbtxt, artifacts and labels, swapped in whole."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tpserve.builders.repository.model_config import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    TensorConfig,
    Warmup,
)
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import ConfigError
from tpserve.triton_models import ONNXRUNTIME_MODEL

TARGETS = ("embedded", "ngc")
LABELS = "labels.txt"


# No queue policy by default: tritonserver 2.51's dynamic batcher misbehaves with one. With a timeout it left a few
# requests waiting until it (35 of 20,003 at concurrency 8 on a tiny model here; triton-inference-server/server#8870,
# #5783); with max_queue_size alone a two-instance ragged text model swung between 26 and 470 infer/s at concurrency
# 2 (perf_analyzer could not stabilize; without the policy it did at once). Set them per model where you want them;
# a cancelling client's calls are answered unrun instead (triton_models/python_backend/cancelled_calls.py), and
# Envoy bounds what is in flight per replica (its circuit breaker).
DEFAULT_QUEUE_TIMEOUT_MS = 0.0
QUEUE_PER_BATCH = 8  # queued requests per batch the instances can run at once, by default
MIN_QUEUE = 64


@dataclass(frozen=True, kw_only=True)
class ServingOptions:
    """Repository-level knobs that do not change the artifact."""

    instances: int = 0  # 0: the model's default (instance_count)
    kind: str = "KIND_CPU"
    max_queue_delay_us: int = 100
    preferred_batch_sizes: tuple[int, ...] = ()
    dynamic_batching: bool = True
    intra_op_threads: int = 0  # 0: the cores shared among the instances (ONNX Runtime's default for one)
    ragged_batching: bool = True  # sequence models: requests of every length in one batch (False: same shapes only)
    queue_policy: QueuePolicy | None = None  # None: default_queue_policy's bounds from the fields below
    max_queue_size: int = 0  # 0: unbounded (tritonserver 2.51: see DEFAULT_QUEUE_TIMEOUT_MS); -1: QUEUE_PER_BATCH x
    # max_batch_size x instances
    queue_timeout_ms: float = DEFAULT_QUEUE_TIMEOUT_MS  # a request queued longer is refused unrun; 0: never
    priority_levels: int = 0
    default_priority: int = 0
    response_cache: bool = False
    warmup_batch_sizes: tuple[int, ...] = (1,)

    def __post_init__(self):
        if self.max_queue_size < -1 or self.queue_timeout_ms < 0:
            raise ConfigError(
                f"max_queue_size {self.max_queue_size} and queue_timeout_ms {self.queue_timeout_ms}: expected "
                "max_queue_size >= 0 (0: unbounded, -1: the default) and queue_timeout_ms >= 0 (0: no timeout)"
            )


def default_target() -> str:
    """'ngc' where a Docker engine answers and a GPU is here (the NGC images' hosts), else 'embedded' (a laptop
    with Docker serves the embedded target from our own image: `make serve-docker`)."""
    import subprocess

    try:
        for command in (["docker", "info"], ["nvidia-smi", "-L"]):
            if subprocess.run(command, capture_output=True, timeout=10).returncode != 0:
                return "embedded"
    except (OSError, subprocess.TimeoutExpired):
        return "embedded"
    return "ngc"


def _tensor_config(tensor, label_file: str | None = None) -> TensorConfig:
    fmt = f"FORMAT_{tensor.image_format}" if tensor.image_format else None
    return TensorConfig(tensor.name, f"TYPE_{tensor.dtype}", tensor.dims, fmt, label_file)


def model_config(spec: ModelSpec, target: str, options: ServingOptions = ServingOptions()) -> ModelConfig:
    """The Triton config of a spec for a target ('embedded': Python backend, 'ngc': native backend)."""
    if target not in TARGETS:
        raise ConfigError(f"target {target!r} is unknown; expected one of {TARGETS}")
    outputs = [_tensor_config(t) for t in spec.outputs]
    if spec.labels:
        outputs[0] = _tensor_config(spec.outputs[0], LABELS)
    inputs = [_tensor_config(t) for t in spec.inputs]
    if target == "embedded" and options.ragged_batching and ragged_inputs(spec):  # rows of every length together
        inputs = [dataclasses.replace(t, ragged=True) for t in inputs]
    batching = None
    if options.dynamic_batching:
        batching = DynamicBatching(
            options.preferred_batch_sizes,
            options.max_queue_delay_us,
            options.queue_policy or default_queue_policy(spec, target, options),
            options.priority_levels,
            options.default_priority,
        )
    return ModelConfig(
        name=spec.name,
        max_batch_size=spec.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        dynamic_batching=batching,
        instance_groups=[InstanceGroup(instance_count(spec, target, options), options.kind)],
        warmup=[
            Warmup(
                f"random_batch_{b}",
                b,
                [TensorConfig(t.name, t.data_type, _warm_dims(t)) for t in inputs],
                _warm_fill(spec, inputs),
                [t.name for t in spec.inputs if t.warms_with_zeros],
            )
            for b in options.warmup_batch_sizes
        ],
        response_cache=options.response_cache,
        **_backend_fields(target, options, spec),
    )


CPU_SEQUENCE_INSTANCES = 2


def default_queue_policy(spec: ModelSpec, target: str, options: ServingOptions) -> QueuePolicy | None:
    """The queue bound a spec asks for: max_queue_size (-1: QUEUE_PER_BATCH full batches per instance, MIN_QUEUE at
    least); a request beyond it is refused at once and unrun (Triton: UNAVAILABLE, HTTP 503, "Exceeds maximum queue
    size"); queue_timeout_ms adds Triton's REJECT timeout. None: nothing to bound, the default (see
    DEFAULT_QUEUE_TIMEOUT_MS for why)."""
    size = options.max_queue_size
    if size < 0:
        size = max(MIN_QUEUE, QUEUE_PER_BATCH * max(spec.max_batch_size, 1) * instance_count(spec, target, options))
    timeout_us = int(round(options.queue_timeout_ms * 1000))
    if size == 0 and timeout_us == 0:
        return None
    return QueuePolicy(max_queue_size=size, timeout_us=timeout_us, timeout_action="REJECT")


def instance_count(spec: ModelSpec, target: str, options: ServingOptions) -> int:
    """The instances asked for, or by default: two for a sequence model on the CPU (the embedded target's ONNX
    Runtime, the cores shared between them: one instance's Python overlaps the other's compute; 117 against 84
    single sentences/s on two cores, docs/benchmarks.md), one for any other model."""
    if options.instances:
        return options.instances
    sequence_on_cpu = target == "embedded" and options.kind == "KIND_CPU" and ragged_inputs(spec)
    return CPU_SEQUENCE_INSTANCES if sequence_on_cpu else 1


def ragged_inputs(spec: ModelSpec) -> bool:
    """Whether every input is one sequence axis per sample ([-1]): such requests batch across lengths
    (triton_models/runtime/ragged.py) in the embedded target's backends."""
    return all(list(t.dims) == [-1] for t in spec.inputs)


def _warm_dims(tensor: TensorConfig) -> tuple[int, ...]:
    return tuple(8 if d == -1 else d for d in tensor.dims)


def _warm_fill(spec: ModelSpec, inputs) -> dict[str, float]:
    """The config's inputs whose warmup sample cannot be zeros, with the value they get instead (a mask: 1; a
    value_range that excludes 0: its low end)."""
    ours = {t.name: t for t in spec.inputs}
    fill = {}
    for tensor in inputs:
        spec_tensor = ours.get(tensor.name)
        value = spec_tensor.warm_value() if spec_tensor and tensor.data_type == f"TYPE_{spec_tensor.dtype}" else None
        if value is not None:
            fill[tensor.name] = value
    return fill


def input_checks(spec: ModelSpec, wire_uint8: str | None = None):
    """The spec's declaration that a served model holds each request to (triton_models/runtime/input_checks.py):
    inputs' value ranges, named axes and their lengths, float inputs declared finite; None where there is
    nothing to check."""
    from tpserve.triton_models.runtime.input_checks import InputChecks

    held = [t for t in spec.inputs if t.name != wire_uint8]
    ranges = {t.name: _held_range(t) for t in held if t.value_range is not None and t.dtype != "BOOL"}
    axes = {t.name: _dim_axes(t) for t in spec.inputs if -1 in t.dims}
    lengths = {axis: list(spec.axis_range(axis)) for names in axes.values() for axis in names if axis}
    finite = [t.name for t in held if t.finite]
    found = InputChecks(ranges, axes, lengths, finite)
    return found if ranges or axes or finite else None


def _held_range(tensor) -> list:
    """The range a request's values are held to: integers in [low, high), floats in [low, high]."""
    low, high = tensor.value_range
    if tensor.dtype.startswith(("INT", "UINT")):
        return [int(low), int(high)]
    return [float(low), float(high)]


def _numeric_only(spec: ModelSpec) -> bool:
    """Whether every input and output is a number (no BYTES or BOOL): all of them cross the Python-backend stub
    through DLPack (triton_models/python_backend/dlpack_io.py)."""
    return all(t.dtype not in ("BYTES", "BOOL") for t in (*spec.inputs, *spec.outputs))


def _dim_axes(tensor) -> list[str | None]:
    """The axis name of each dim of a tensor (None where the dim is fixed); unnamed dynamic dims are dim<i>."""
    names = iter(tensor.axes or [f"dim{i}" for i, d in enumerate(tensor.dims) if d == -1])
    return [next(names, f"dim{i}") if d == -1 else None for i, d in enumerate(tensor.dims)]


def _backend_fields(target: str, options: ServingOptions, spec: ModelSpec | None = None) -> dict:
    if target == "embedded":
        params = {"artifact": "model.onnx", "runtime": "onnxruntime", "intra_op_threads": options.intra_op_threads}
        if spec is not None and _numeric_only(spec):
            params["dlpack_outputs"] = 1  # its tensors cross through DLPack: served under numpy 1 and 2 alike
        checks = input_checks(spec) if spec is not None else None
        if checks is not None:
            params["input_checks"] = checks.to_json()
        return {"backend": "python", "parameters": params}
    return {"platform": "onnxruntime_onnx", "backend": None, "default_model_filename": "model.onnx"}


@dataclass(frozen=True, kw_only=True)
class TorchRuntime:
    """The torch runtime of the embedded target (GPU or CPU instances)."""

    precision: str = "fp32"
    channels_last: bool = False
    cuda_graphs: bool = False
    uint8_input: bool = False
    graph_batch_sizes: tuple[int, ...] = ()
    compiler: str = ""  # "inductor": a compiled engine (torch.compile, built ahead of time with its cache)
    host_outputs: bool = False  # outputs leave the stub from host memory instead of CUDA IPC
    staged: bool = True  # with CUDA graphs: the staged request path (torch_runtime.StagedRunner); False: earlier
    inprocess: bool = False  # served by the in-process backend (triton_models/inprocess/backend.py), not a stub
    native: bool = True  # in-process with CUDA graphs: batches served natively (no Python per batch); False: by Python
    length_buckets: tuple[int, ...] = ()  # sequence models: the lengths rows are padded to (default 16, 32, ...)
    token_budget: int = 0  # sequence models: most rows x length per run (0: 16,384)

    def __post_init__(self):
        if self.precision not in TORCH_PRECISIONS:
            raise ConfigError(f"torch runtime precision {self.precision!r}: expected one of {TORCH_PRECISIONS}")
        if self.compiler not in ("", "inductor"):
            raise ConfigError(f"compiler {self.compiler!r}: expected 'inductor' (torch.compile) or '' (eager)")

    def variant(self, model: str) -> str:
        """Repository name: <model>_torch_<precision>[_graphs][_u8][_inproc], or
        <model>_inductor_<precision>[_nographs][_u8][_inproc]."""
        u8 = ("_u8" if self.uint8_input else "") + ("_unstaged" if self.cuda_graphs and not self.staged else "")
        u8 += "_inproc" if self.inprocess else ""
        u8 += "_python" if self.inprocess and not self.native else ""
        if self.compiler:
            return f"{model}_{self.compiler}_{self.precision}{'' if self.cuda_graphs else '_nographs'}{u8}"
        return f"{model}_torch_{self.precision}{'_graphs' if self.cuda_graphs else ''}{u8}"


TORCH_PRECISIONS = ("fp32", "fp16", "bf16")


def is_torch_runtime(config) -> bool:
    """Whether a parsed config (model_config_pb2.ModelConfig) serves a torch-runtime variant."""
    return "runtime" in config.parameters and config.parameters["runtime"].string_value == "torch"


def ragged_off_problem(spec: ModelSpec, options: ServingOptions) -> ConfigError | None:
    """Why this sequence model's compiled engine cannot be built with these options (ragged_batching off), or None."""
    if options.ragged_batching or not ragged_inputs(spec):
        return None
    return ConfigError(
        f"{spec.name}: the compiled engines of a sequence model batch requests of every length together (their CUDA "
        "graphs and buffers are sized by length buckets); ragged_batching off applies to the ONNX Runtime model "
        "only: build the compiled engines without it (drop --no-ragged-batching / RAGGED=0)"
    )


def torch_config(spec: ModelSpec, runtime: TorchRuntime, options: ServingOptions) -> ModelConfig:
    """Config of a torch-runtime variant: Python backend, GPU-resident inputs where the kind is GPU."""
    sequence = ragged_inputs(spec)
    problem = ragged_off_problem(spec, options)
    if problem is not None:
        raise problem
    if runtime.cuda_graphs and not sequence and any(-1 in t.dims for t in spec.inputs):
        raise ConfigError(
            f"{spec.name}: CUDA graphs need inputs of fixed per-sample dims, or inputs that are all one "
            f"sequence axis ([-1]); the spec has {[(t.name, list(t.dims)) for t in spec.inputs]}; build the torch "
            "variant without cuda_graphs"
        )
    if options.kind == "KIND_GPU" and options.instances > 1 and options.dynamic_batching and not runtime.inprocess:
        raise ConfigError(
            f"{spec.name}: {options.instances} KIND_GPU instances with dynamic batching: the torch runtime's "
            "throughput collapses there (0.15-0.26x of no batching on the H100, with or without CUDA MPS; "
            "docs/benchmarks.md). Use 1 instance with dynamic batching, several with dynamic_batching off, or the "
            "in-process backend (--inprocess), whose instances share one process"
        )
    options = dataclasses.replace(options, instances=options.instances or 1)  # the CPU default is ONNX Runtime's
    base = model_config(dataclasses.replace(spec, name=runtime.variant(spec.name)), "embedded", options)
    params = {
        "runtime": "torch",
        "precision": runtime.precision,
        "channels_last": int(runtime.channels_last),
        "cuda_graphs": int(runtime.cuda_graphs),
        "compiler": runtime.compiler,
        "host_outputs": int(runtime.host_outputs),
        "staged": int(runtime.staged),
        "native_path": int(runtime.native),
        "graph_batch_sizes": " ".join(map(str, runtime.graph_batch_sizes)),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no" if options.kind == "KIND_GPU" else "yes",
    }
    # held per request by every path (runtime/input_checks.py); a uint8 image on the wire is bytes, not the spec's
    # float range
    checks = input_checks(spec, wire_uint8=spec.image_input.name if runtime.uint8_input and spec.image_input else None)
    if checks is not None:
        params["input_checks"] = checks.to_json()
    if sequence:
        params.update(ragged=1, length_buckets=" ".join(map(str, runtime.length_buckets)))
        params["token_budget"] = runtime.token_budget or ""
    inputs = base.inputs
    if runtime.uint8_input:
        image = spec.image_input
        if image is None or spec.preprocessing is None:
            raise ConfigError(f"{spec.name}: a uint8 image input needs an image input with preprocessing")
        height, width = spec.preprocessing.image_size
        hwc = (height, width, spec.preprocessing.channels)
        inputs = (TensorConfig(image.name, "TYPE_UINT8", hwc, "FORMAT_NHWC"),)
    warm = [TensorConfig(t.name, t.data_type, _warm_dims(t)) for t in inputs]
    warmup = [Warmup("random", 1, warm, _warm_fill(spec, inputs), [t.name for t in spec.inputs if t.warms_with_zeros])]
    backend = INPROCESS_BACKEND if runtime.inprocess else base.backend
    return dataclasses.replace(base, backend=backend, parameters=params, inputs=inputs, warmup=warmup)


INPROCESS_BACKEND = "torch_inprocess"  # server/triton/inprocess_build.py builds it where a repository names it


def write_model(repo: Path, spec: ModelSpec, config: ModelConfig, artifacts: dict, target: str) -> Path:
    """Write <repo>/<model>/ (config.pbtxt, labels, version 1) atomically; return its path.

    Args:
        artifacts: file name in the version folder -> source path (model.onnx, model_sm90.plan, ...).

    The folder is assembled under a hidden staging name and renamed into place only when
    complete, so a failure never leaves a half-written model in the repository.
    """
    repo.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{spec.name}-", dir=repo))
    try:
        _fill_model_dir(staging, spec, config, artifacts, target)
        _swap_into_place(staging, repo / spec.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return repo / spec.name


def _fill_model_dir(folder: Path, spec: ModelSpec, config: ModelConfig, artifacts: dict, target: str) -> None:
    version = folder / "1"
    version.mkdir()
    for name, source in artifacts.items():
        shutil.copyfile(source, version / name)
    if config.backend == "python" and "model.py" not in artifacts:
        shutil.copyfile(ONNXRUNTIME_MODEL, version / "model.py")
    if spec.labels:
        (folder / LABELS).write_text("\n".join(spec.labels) + "\n")
    (folder / "config.pbtxt").write_text(config.to_pbtxt())
    for sample in config.warmup:  # the values an input's warmup reads where zeros would be refused
        for name, data in sample.data_files().items():
            (folder / "warmup").mkdir(exist_ok=True)
            (folder / "warmup" / name).write_bytes(data)
    os.chmod(folder, 0o755)


def _swap_into_place(staging: Path, final: Path) -> None:
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
