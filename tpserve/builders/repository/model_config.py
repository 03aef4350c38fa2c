"""Typed Triton model configurations, validated on construction, written through model_config_pb2."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpserve.common.errors import ConfigError

KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO")
FORMATS = ("FORMAT_NCHW", "FORMAT_NHWC")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def _data_types() -> set[str]:
    from tritonclient.grpc import model_config_pb2

    return set(model_config_pb2.DataType.keys()) - {"TYPE_INVALID"}


NUMPY_TYPES = {  # warmup files
    **{"TYPE_INT64": "int64", "TYPE_INT32": "int32", "TYPE_UINT8": "uint8", "TYPE_BOOL": "bool"},
    **{"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_FP64": "float64"},
}


@dataclass(frozen=True)
class TensorConfig:
    """An input or output of a model config (dims exclude the batch axis)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    format: str | None = None
    label_filename: str | None = None
    ragged: bool = False  # allow_ragged_batch: requests of different lengths join one dynamic batch

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(self.dims))
        if self.data_type not in _data_types():
            raise ConfigError(f"tensor {self.name!r}: data_type {self.data_type!r} is unknown; expected e.g. TYPE_FP32")
        if not self.dims or any(not isinstance(d, int) or (d < 1 and d != -1) for d in self.dims):
            raise ConfigError(f"tensor {self.name!r}: dims {list(self.dims)} must be positive ints or -1")
        if self.format and (self.format not in FORMATS or len(self.dims) != 3):
            raise ConfigError(
                f"tensor {self.name!r}: format {self.format!r} needs one of {FORMATS} and 3 dims, "
                f"got dims {list(self.dims)}"
            )


TIMEOUT_ACTIONS = ("REJECT", "DELAY")


@dataclass(frozen=True)
class QueuePolicy:
    """What happens to queued requests: bounded queue, timeout, and the action on timeout."""

    max_queue_size: int = 0  # 0: unbounded
    timeout_us: int = 0  # 0: no timeout
    timeout_action: str = "REJECT"
    allow_timeout_override: bool = True

    def __post_init__(self):
        if self.timeout_action not in TIMEOUT_ACTIONS:
            raise ConfigError(f"queue policy timeout_action {self.timeout_action!r}: expected one of {TIMEOUT_ACTIONS}")
        if self.max_queue_size < 0 or self.timeout_us < 0:
            raise ConfigError(
                f"queue policy max_queue_size {self.max_queue_size} and timeout_us {self.timeout_us} must be >= 0"
            )


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's dynamic batcher: preferred sizes, queue delay, queue policy and priority levels."""

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    queue_policy: QueuePolicy | None = None
    priority_levels: int = 0
    default_priority_level: int = 0

    def __post_init__(self):
        object.__setattr__(self, "preferred_batch_size", tuple(self.preferred_batch_size))
        if any(b < 1 for b in self.preferred_batch_size) or self.max_queue_delay_microseconds < 0:
            raise ConfigError(
                f"dynamic_batching: preferred sizes {list(self.preferred_batch_size)} must be >= 1 and "
                f"max_queue_delay_microseconds {self.max_queue_delay_microseconds} >= 0"
            )
        if self.priority_levels and not 1 <= self.default_priority_level <= self.priority_levels:
            raise ConfigError(
                f"dynamic_batching: default_priority_level {self.default_priority_level} must lie within "
                f"1..priority_levels ({self.priority_levels})"
            )


@dataclass(frozen=True)
class InstanceGroup:
    """How many copies of the model run, and where."""

    count: int = 1
    kind: str = "KIND_CPU"
    gpus: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "gpus", tuple(self.gpus))
        if self.kind not in KINDS:
            raise ConfigError(f"instance_group kind {self.kind!r} is unknown; expected one of {KINDS}")
        if not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"instance_group count {self.count!r} must be an int >= 1")
        if self.gpus and self.kind != "KIND_GPU":
            raise ConfigError(f"instance_group gpus {list(self.gpus)} are only valid with KIND_GPU, not {self.kind}")


@dataclass(frozen=True)
class Warmup:
    """One warmup sample set of the given batch size: random floats, zero integers, per input; an input whose zero
    the model refuses (token ids from 1000, a mask of real tokens, a float range above 0) reads one value from a
    file instead:
    fill, input -> that value (ModelSpec's TensorSpec.warm_value)."""

    name: str
    batch_size: int
    inputs: Sequence[TensorConfig]
    fill: Mapping[str, float] = field(default_factory=dict)
    # float inputs warmed with zeros: declared finite or bounded (Triton's random data holds NaN and infinities)
    zeros: Sequence[str] = ()

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "fill", dict(self.fill))
        object.__setattr__(self, "zeros", tuple(self.zeros))
        if self.batch_size < 1:
            raise ConfigError(f"warmup {self.name!r}: batch_size {self.batch_size} must be >= 1")
        unknown = set(self.fill) - {t.name for t in self.inputs}
        if unknown:
            raise ConfigError(f"warmup {self.name!r}: fill names unknown inputs {sorted(unknown)}")

    def file_name(self, tensor: str) -> str:
        """Its file under <model>/warmup/ for one filled input (Triton's input_data_file)."""
        return f"{self.name}_{tensor}"

    def data_files(self) -> dict[str, bytes]:
        """file name -> the raw, row-major values of one sample (Triton repeats it to batch_size)."""
        import numpy as np

        files = {}
        for tensor in self.inputs:
            if tensor.name in self.fill:
                dtype = np.dtype(NUMPY_TYPES[tensor.data_type])
                files[self.file_name(tensor.name)] = np.full(tensor.dims, self.fill[tensor.name], dtype).tobytes()
        return files


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: a model, and how its tensors map to the ensemble's."""

    model_name: str
    input_map: dict  # the step model's input name -> ensemble tensor name
    output_map: dict  # the step model's output name -> ensemble tensor name


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A Triton model configuration.

    Exactly one of backend (e.g. "python", "onnxruntime") or platform (e.g.
    "onnxruntime_onnx", "tensorrt_plan") is required.
    """

    name: str
    max_batch_size: int
    inputs: Sequence[TensorConfig]
    outputs: Sequence[TensorConfig]
    backend: str | None = None
    platform: str | None = None
    dynamic_batching: DynamicBatching | None = None
    instance_groups: Sequence[InstanceGroup] = ()
    latest_versions: int = 1
    warmup: Sequence[Warmup] = ()
    parameters: dict = field(default_factory=dict)
    default_model_filename: str | None = None
    cc_model_filenames: dict = field(default_factory=dict)
    ensemble_steps: Sequence[EnsembleStep] = ()
    response_cache: bool = False

    def __post_init__(self):
        for attr in ("inputs", "outputs", "instance_groups", "warmup", "ensemble_steps"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        if not _NAME.match(self.name or ""):
            raise ConfigError(f"model name {self.name!r} is invalid: use letters, digits, '_', '-', '.'")
        if bool(self.backend) == bool(self.platform):
            raise ConfigError(
                f"model {self.name!r}: give exactly one of backend or platform "
                f"(got backend={self.backend!r}, platform={self.platform!r})"
            )
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 0:
            raise ConfigError(f"model {self.name!r}: max_batch_size {self.max_batch_size!r} must be an int >= 0")
        if not self.inputs or not self.outputs:
            raise ConfigError(f"model {self.name!r}: needs at least one input and one output")
        self._check_batching()
        self._check_warmup()
        self._check_ensemble()

    def _check_ensemble(self):
        if (self.platform == "ensemble") != bool(self.ensemble_steps):
            raise ConfigError(f"model {self.name!r}: platform 'ensemble' and ensemble steps go together")
        produced = {t.name for t in self.inputs}
        for step in self.ensemble_steps:
            missing = sorted(set(step.input_map.values()) - produced)
            if missing:
                raise ConfigError(
                    f"ensemble {self.name!r}: step {step.model_name!r} reads {missing}, which no earlier step "
                    "or ensemble input produces; order the steps or fix the tensor names"
                )
            produced |= set(step.output_map.values())
        unproduced = sorted({t.name for t in self.outputs} - produced) if self.ensemble_steps else []
        if unproduced:
            raise ConfigError(f"ensemble {self.name!r}: outputs {unproduced} are produced by no step")

    def _check_batching(self):
        if self.dynamic_batching is None:
            return
        if self.max_batch_size == 0:
            raise ConfigError(
                f"model {self.name!r}: dynamic_batching needs max_batch_size >= 1; "
                "set max_batch_size or drop dynamic_batching"
            )
        too_big = [b for b in self.dynamic_batching.preferred_batch_size if b > self.max_batch_size]
        if too_big:
            raise ConfigError(
                f"model {self.name!r}: preferred_batch_size {too_big} > max_batch_size "
                f"{self.max_batch_size}; lower the preferred sizes or raise max_batch_size"
            )

    def _check_warmup(self):
        names = {t.name for t in self.inputs}
        for sample in self.warmup:
            if sample.batch_size > max(self.max_batch_size, 1):
                raise ConfigError(
                    f"model {self.name!r}: warmup {sample.name!r} batch_size {sample.batch_size} > "
                    f"max_batch_size {self.max_batch_size}"
                )
            unknown = sorted({t.name for t in sample.inputs} - names)
            if unknown:
                raise ConfigError(f"model {self.name!r}: warmup {sample.name!r} names unknown inputs {unknown}")

    def to_proto(self):
        """The config as a model_config_pb2.ModelConfig message."""
        from tritonclient.grpc import model_config_pb2 as pb

        msg = pb.ModelConfig(name=self.name, max_batch_size=self.max_batch_size)
        msg.backend = self.backend or ""
        msg.platform = self.platform or ""
        if self.default_model_filename:
            msg.default_model_filename = self.default_model_filename
        msg.input.extend(_input_proto(pb, t) for t in self.inputs)
        msg.output.extend(_output_proto(pb, t) for t in self.outputs)
        msg.version_policy.latest.num_versions = self.latest_versions
        for group in self.instance_groups:
            msg.instance_group.add(
                count=group.count, kind=pb.ModelInstanceGroup.Kind.Value(group.kind), gpus=group.gpus
            )
        if self.dynamic_batching is not None:
            _batching_proto(pb, msg.dynamic_batching, self.dynamic_batching)
        for step in self.ensemble_steps:
            msg.ensemble_scheduling.step.add(
                model_name=step.model_name, model_version=-1, input_map=step.input_map, output_map=step.output_map
            )
        if self.response_cache:
            msg.response_cache.enable = True
        msg.model_warmup.extend(_warmup_proto(pb, w) for w in self.warmup)
        for key, value in self.parameters.items():
            msg.parameters[key].string_value = str(value)
        msg.cc_model_filenames.update(self.cc_model_filenames)
        return msg

    def to_pbtxt(self) -> str:
        """The config in protobuf text format, as config.pbtxt holds it."""
        return proto_to_pbtxt(self.to_proto())


def on_gpu(message) -> bool:
    """Whether a model_config_pb2.ModelConfig puts an instance group on a GPU (KIND_GPU)."""
    from tritonclient.grpc import model_config_pb2 as pb

    return any(g.kind == pb.ModelInstanceGroup.KIND_GPU for g in message.instance_group)


def proto_to_pbtxt(message) -> str:
    """A model_config_pb2.ModelConfig in protobuf text format, as config.pbtxt holds it."""
    from google.protobuf import text_format

    text = text_format.MessageToString(message)
    # proto3 drops zero-valued scalars; Triton needs max_batch_size: 0 said explicitly.
    return text if message.max_batch_size else f"max_batch_size: 0\n{text}"


def _batching_proto(pb, msg, batching: DynamicBatching) -> None:
    msg.preferred_batch_size.extend(batching.preferred_batch_size)
    msg.max_queue_delay_microseconds = batching.max_queue_delay_microseconds
    if batching.queue_policy is not None:
        policy = batching.queue_policy
        msg.default_queue_policy.timeout_action = pb.ModelQueuePolicy.TimeoutAction.Value(policy.timeout_action)
        msg.default_queue_policy.default_timeout_microseconds = policy.timeout_us
        msg.default_queue_policy.allow_timeout_override = policy.allow_timeout_override
        msg.default_queue_policy.max_queue_size = policy.max_queue_size
    if batching.priority_levels:
        msg.priority_levels = batching.priority_levels
        msg.default_priority_level = batching.default_priority_level


def _input_proto(pb, tensor: TensorConfig):
    msg = pb.ModelInput(name=tensor.name, data_type=pb.DataType.Value(tensor.data_type), dims=tensor.dims)
    if tensor.format:
        msg.format = pb.ModelInput.Format.Value(tensor.format)
    if tensor.ragged:
        msg.allow_ragged_batch = True
    return msg


def _output_proto(pb, tensor: TensorConfig):
    msg = pb.ModelOutput(name=tensor.name, data_type=pb.DataType.Value(tensor.data_type), dims=tensor.dims)
    if tensor.label_filename:
        msg.label_filename = tensor.label_filename
    return msg


def _warmup_proto(pb, warmup: Warmup):
    msg = pb.ModelWarmup(name=warmup.name, batch_size=warmup.batch_size)
    for tensor in warmup.inputs:
        msg.inputs[tensor.name].data_type = pb.DataType.Value(tensor.data_type)
        msg.inputs[tensor.name].dims.extend(tensor.dims)
        if tensor.name in warmup.fill:
            msg.inputs[tensor.name].input_data_file = warmup.file_name(tensor.name)
        elif tensor.data_type.startswith("TYPE_FP") and tensor.name not in warmup.zeros:
            msg.inputs[tensor.name].random_data = True
        else:  # random integers would be out-of-range ids, masks or indices
            msg.inputs[tensor.name].zero_data = True
    return msg


def parse_pbtxt(text: str) -> Any:
    """Parse config.pbtxt text into a model_config_pb2.ModelConfig message.

    Raises:
        ConfigError: the text is not a valid model configuration.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as err:
        raise ConfigError(f"config.pbtxt does not parse as a Triton ModelConfig: {err}") from err


def from_dict(data: dict) -> ModelConfig:
    """Build a ModelConfig from its plain form (e.g. a JSON golden fixture)."""
    data = dict(data)
    try:
        data["inputs"] = [TensorConfig(**t) for t in data.get("inputs", [])]
        data["outputs"] = [TensorConfig(**t) for t in data.get("outputs", [])]
        data["instance_groups"] = [InstanceGroup(**g) for g in data.get("instance_groups", [])]
        if data.get("dynamic_batching") is not None:
            batching = dict(data["dynamic_batching"])
            if batching.get("queue_policy"):
                batching["queue_policy"] = QueuePolicy(**batching["queue_policy"])
            data["dynamic_batching"] = DynamicBatching(**batching)
        data["ensemble_steps"] = [EnsembleStep(**s) for s in data.get("ensemble_steps", [])]
        data["warmup"] = [
            Warmup(
                w["name"],
                w["batch_size"],
                [TensorConfig(**t) for t in w["inputs"]],
                w.get("fill", {}),
                w.get("zeros", ()),
            )
            for w in data.get("warmup", [])
        ]
        return ModelConfig(**data)
    except TypeError as err:
        raise ConfigError(f"model config is malformed: {err}") from err


def repository_configs(repo) -> list[tuple[str, Any]]:
    """(model name, parsed config) of every model folder of a repository, in name order; a config that does
    not parse is left out (Triton refuses that model anyway)."""
    from pathlib import Path

    found = []
    for path in sorted(Path(repo).glob("*/config.pbtxt")):
        try:
            config = parse_pbtxt(path.read_text())
        except ConfigError:
            continue
        found.append((config.name or path.parent.name, config))
    return found
