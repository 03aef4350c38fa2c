"""Model specs: everything the build needs to know about a model, validated on construction."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field

from tpserve.common.errors import SpecError

# Triton data types (without the TYPE_ prefix) and their numpy names.
DTYPES = {
    "FP32": "float32",
    "FP16": "float16",
    "INT64": "int64",
    "INT32": "int32",
    "UINT8": "uint8",
    "BOOL": "bool",
    "BYTES": "object",
}
IMAGE_FORMATS = ("NCHW", "NHWC")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
DEFAULT_TOLERANCES = {"fp32": (1e-4, 1e-3), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 5e-2), "int8": (1e-1, 1e-1)}
# a quantized variant's every output against FP32 on the same rows (builders/checks/agreement.py): the mean cosine
# of a row's values at least, their relative error (L2 over all rows) at most, and for class scores (an output of one
# dim wider than 1) the share of rows whose top class agrees at least
AGREEMENT_FIGURES = ("cosine", "relative_error", "top1")
DEFAULT_AGREEMENT = {"int8": {"cosine": 0.99, "relative_error": 0.15, "top1": 0.9}}
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_TENSOR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


FLOAT_DTYPES = ("FP32", "FP16", "BF16", "FP64")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor, per sample (the batch axis is implicit).

    Args:
        name: tensor name, as in the ONNX graph and the Triton config.
        dtype: Triton data type without the TYPE_ prefix, e.g. "FP32".
        dims: per-sample dims; -1 marks a dynamic axis.
        image_format: "NCHW" or "NHWC" for image inputs, else None.
        axes: a name per dynamic (-1) dim, in order; dynamic dims with the same name have the
            same length in every input (e.g. the sequence of token ids and of their mask).
            Default: "dim<position>", so dynamic dims at the same position share a length.
        value_range: (low, high) of the values the input takes: generated sample data (validation, clients,
            perf_analyzer, Locust, warmup) is drawn from it, integers in [low, high), floats uniform in [low, high);
            served, a request with a value outside it (integers: [low, high), floats: [low, high], NaN outside any)
            is refused, naming the row, before the model runs. Default: no bound; generated integers in [0, 100),
            floats standard normal. A mask (is_mask) gets real masks instead:
            each row a prefix of ones, at least one, then zeros.
        finite: a float input whose values must be finite: a request carrying NaN or an infinity is refused,
            naming the row, before the model runs (as a value outside an integer input's value_range is).
    """

    name: str
    dtype: str
    dims: tuple[int, ...]
    image_format: str | None = None
    axes: tuple[str, ...] = ()
    value_range: tuple[float, float] | None = None
    finite: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(self.dims))
        object.__setattr__(self, "axes", tuple(self.axes))
        if self.value_range is not None:
            object.__setattr__(self, "value_range", tuple(self.value_range))
        if not _TENSOR_NAME.match(self.name or ""):
            raise SpecError(f"tensor name {self.name!r} is invalid: use letters, digits and '_'")
        if self.dtype not in DTYPES:
            raise SpecError(f"tensor {self.name!r}: dtype {self.dtype!r} is unknown; expected one of {sorted(DTYPES)}")
        bad = [d for d in self.dims if not isinstance(d, int) or (d < 1 and d != -1)]
        if not self.dims or bad:
            raise SpecError(
                f"tensor {self.name!r}: dims {list(self.dims)} are invalid; "
                "give at least one per-sample dim, each a positive int or -1 for a dynamic axis"
            )
        self._check_image_format()
        self._check_axes()
        self._check_value_range()
        if self.finite and self.dtype not in FLOAT_DTYPES:
            raise SpecError(f"tensor {self.name!r}: finite applies to float inputs, not {self.dtype}")

    def _check_axes(self):
        dynamic = [i for i, d in enumerate(self.dims, start=1) if d == -1]
        if not self.axes:
            object.__setattr__(self, "axes", tuple(f"dim{i}" for i in dynamic))
        bad = [a for a in self.axes if not isinstance(a, str) or not _TENSOR_NAME.match(a)]
        if len(self.axes) != len(dynamic) or bad:
            raise SpecError(
                f"tensor {self.name!r}: axes {list(self.axes)} must name each of its {len(dynamic)} dynamic (-1) "
                "dims, in order, with letters, digits and '_'"
            )

    def _check_value_range(self):
        pair = self.value_range
        if pair is None:
            return
        if self.dtype == "BYTES" or len(pair) != 2 or not all(isinstance(v, (int, float)) for v in pair):
            raise SpecError(
                f"tensor {self.name!r}: value_range {list(pair)} is invalid; give [low, high] numbers "
                "(not for BYTES tensors)"
            )
        if not pair[0] < pair[1]:
            raise SpecError(f"tensor {self.name!r}: value_range {list(pair)} needs low < high")

    @property
    def is_mask(self) -> bool:
        """An integer input named like a mask ("attention_mask") over a sequence, whose range holds 0 and 1: its
        generated rows are a prefix of ones (real tokens, at least one) then zeros, as a tokenizer writes them."""
        integer = self.dtype.startswith(("INT", "UINT")) or self.dtype == "BOOL"
        low, high = self.value_range or (0, 2)
        return integer and "mask" in self.name.lower() and len(self.dims) >= 1 and low <= 0 and high > 1

    def warm_value(self) -> float | None:
        """The value an input's warmup sample holds where zero is not one it accepts: 1 for a mask (a row of real
        tokens), the lowest of its value_range otherwise; None where zeros serve (or random data: no bound)."""
        import math

        if self.is_mask and self.dtype in ("INT64", "INT32", "UINT8", "BOOL"):
            return 1
        if self.value_range is None or self.dtype in ("BYTES", "BOOL"):
            return None
        low, high = self.value_range
        if self.dtype in FLOAT_DTYPES:
            return None if low <= 0 <= high else float(low)
        lowest = math.ceil(low)
        return None if lowest <= 0 < high else lowest

    @property
    def warms_with_zeros(self) -> bool:
        """A float input whose warmup cannot take Triton's random data (it holds NaN, infinities and values far
        outside any range): declared finite, or given a value_range."""
        return self.dtype in FLOAT_DTYPES and (self.finite or self.value_range is not None)

    def dynamic_axes(self) -> dict[int, str]:
        """Position in the per-sample dims (1-based, after the batch axis) -> axis name."""
        positions = [i for i, d in enumerate(self.dims, start=1) if d == -1]
        return dict(zip(positions, self.axes))

    def _check_image_format(self):
        if self.image_format is None:
            return
        if self.image_format not in IMAGE_FORMATS:
            raise SpecError(
                f"tensor {self.name!r}: image_format {self.image_format!r} is unknown; expected one of {IMAGE_FORMATS}"
            )
        if len(self.dims) != 3:
            raise SpecError(
                f"tensor {self.name!r}: image_format {self.image_format} needs 3 per-sample dims "
                f"(C,H,W or H,W,C), got {list(self.dims)}"
            )

    @property
    def numpy_dtype(self) -> str:
        """The numpy dtype name of this tensor."""
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class Preprocessing:
    """How raw images become model input: resize, scale to [0, 1], normalize per channel."""

    image_size: tuple[int, int]
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self):
        for attr in ("image_size", "mean", "std"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        if self.channels not in (1, 3):
            raise SpecError(f"preprocessing channels {self.channels} is invalid; expected 1 or 3")
        if len(self.image_size) != 2 or min(self.image_size) < 1:
            raise SpecError(f"preprocessing image_size {list(self.image_size)} is invalid; expected [H, W]")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise SpecError(
                f"preprocessing mean/std need {self.channels} values (one per channel), "
                f"got {len(self.mean)} and {len(self.std)}"
            )
        if min(self.std) <= 0:
            raise SpecError(f"preprocessing std {list(self.std)} must be > 0")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model as the build sees it.

    Args:
        name: repository name of the model (lowercase, digits, '_').
        builder: key of the zoo function that builds the torch module.
        inputs: input tensors, per sample.
        outputs: output tensors, per sample.
        max_batch_size: largest batch the model serves (>= 1; the batch axis is dynamic).
        builder_args: keyword arguments of the builder (must be JSON-serializable).
        weights: "random" or a torchvision weights name such as "DEFAULT".
        preprocessing: image preprocessing constants, for image models.
        labels: class names, for classifiers (one per class of the first output).
        validation_batch_sizes: batch sizes the validation gate compares on.
        tolerances: per precision, (atol, rtol) for the validation gate.
        agreement: per quantized precision, the figures every output must reach against FP32 on the calibration
            (or labelled) rows: {"int8": {"cosine": 0.99, "relative_error": 0.15, "top1": 0.9}}.
        opset: ONNX opset to export with.
        dynamic_axes: axis name -> (min, max) length, for the inputs' named dynamic dims.
            Export bounds the axis by it; validation runs the min, the max and a length between.
        pooling: "mean": the module's token embeddings are mean-pooled over the attention mask and
            L2-normalized inside the exported program (builders/spec/pooling.py); "": none.
    """

    name: str
    builder: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    builder_args: dict = field(default_factory=dict)
    weights: str = "random"
    preprocessing: Preprocessing | None = None
    labels: tuple[str, ...] = ()
    validation_batch_sizes: tuple[int, ...] = (1, 2)
    tolerances: dict = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    agreement: dict = field(default_factory=lambda: {k: dict(v) for k, v in DEFAULT_AGREEMENT.items()})
    opset: int = 18
    dynamic_axes: dict = field(default_factory=dict)
    pooling: str = ""

    def __post_init__(self):
        for attr in ("inputs", "outputs", "labels", "validation_batch_sizes"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        object.__setattr__(self, "dynamic_axes", {k: tuple(v) for k, v in self.dynamic_axes.items()})
        if not _NAME.match(self.name or ""):
            raise SpecError(
                f"model name {self.name!r} is invalid: start with a lowercase letter, "
                "then lowercase letters, digits or '_' (at most 64)"
            )
        self._check_batching()
        self._check_tensors()
        self._check_labels()
        self._check_preprocessing()
        self._check_tolerances()
        self._check_agreement()
        self._check_dynamic_axes()
        self._check_pooling()
        if self.opset < 18:
            raise SpecError(
                f"model {self.name!r}: opset {self.opset} is too old; "
                "use 18 or newer (the torch.export-based exporter needs 18)"
            )

    def _check_batching(self):
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise SpecError(
                f"model {self.name!r}: max_batch_size {self.max_batch_size!r} is invalid; "
                "give an int >= 1 (the exported model has a dynamic batch axis)"
            )
        bad = [b for b in self.validation_batch_sizes if not 1 <= b <= self.max_batch_size]
        if not self.validation_batch_sizes or bad:
            raise SpecError(
                f"model {self.name!r}: validation_batch_sizes {list(self.validation_batch_sizes)} "
                f"must be non-empty and within 1..max_batch_size ({self.max_batch_size})"
            )

    def _check_tensors(self):
        if not self.inputs or not self.outputs:
            raise SpecError(f"model {self.name!r}: needs at least one input and one output")
        names = [t.name for t in self.inputs + self.outputs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"model {self.name!r}: tensor names must be unique, repeated: {dupes}")

    def _check_labels(self):
        if not self.labels:
            return
        classes = self.outputs[0].dims[-1]
        if classes != len(self.labels):
            raise SpecError(
                f"model {self.name!r}: {len(self.labels)} labels given but output "
                f"{self.outputs[0].name!r} has {classes} classes; give one label per class"
            )

    def _check_preprocessing(self):
        pre, image = self.preprocessing, self.image_input
        if pre is None:
            return
        if image is None:
            raise SpecError(
                f"model {self.name!r}: preprocessing is given but no input has an image_format; "
                "set image_format on the image input"
            )
        channels, size = _split_image_dims(image)
        if channels != pre.channels or size != pre.image_size:
            raise SpecError(
                f"model {self.name!r}: preprocessing ({pre.channels} channels, {list(pre.image_size)}) "
                f"does not match input {image.name!r} dims {list(image.dims)} ({image.image_format})"
            )

    def _check_tolerances(self):
        for precision, pair in self.tolerances.items():
            if precision not in PRECISIONS or len(pair) != 2 or min(pair) < 0:
                raise SpecError(
                    f"model {self.name!r}: tolerance {precision}={pair!r} is invalid; expected "
                    f"precision in {PRECISIONS} and (atol, rtol) >= 0"
                )

    def _check_agreement(self):
        for precision, figures in self.agreement.items():
            numbers = all(isinstance(v, (int, float)) and v >= 0 for v in figures.values())
            fractions = all(v <= 1 for k, v in figures.items() if k != "relative_error")
            bad = set(figures) - set(AGREEMENT_FIGURES) or not numbers or not fractions
            if precision not in PRECISIONS or bad:
                raise SpecError(
                    f"model {self.name!r}: agreement {precision}={figures!r} is invalid; expected a precision in "
                    f"{PRECISIONS} and figures among {AGREEMENT_FIGURES} (cosine and top1 in [0, 1], relative_error "
                    ">= 0)"
                )

    def _check_dynamic_axes(self):
        known = {a for t in self.inputs for a in t.axes}
        for axis, pair in self.dynamic_axes.items():
            if axis not in known:
                raise SpecError(
                    f"model {self.name!r}: dynamic_axes names {axis!r}, which no input has; "
                    f"the inputs' dynamic axes are {sorted(known) or 'none'}"
                )
            if len(pair) != 2 or not all(isinstance(v, int) for v in pair) or not 1 <= pair[0] <= pair[1]:
                raise SpecError(
                    f"model {self.name!r}: dynamic_axes {axis}={list(pair)} is invalid; give [min, max] with "
                    "1 <= min <= max"
                )

    def _check_pooling(self):
        from tpserve.builders.spec.pooling import POOLINGS, mask_index

        if self.pooling not in POOLINGS:
            raise SpecError(f'model {self.name!r}: pooling {self.pooling!r} is unknown; use "mean" or leave it out')
        if self.pooling:
            mask_index(self)
            if len(self.outputs) != 1 or len(self.outputs[0].dims) != 1:
                raise SpecError(
                    f"model {self.name!r}: pooling = {self.pooling!r} makes one output of dims [hidden] (the pooled "
                    f"embedding), the spec declares {[(t.name, list(t.dims)) for t in self.outputs]}"
                )

    def longest_sequence(self) -> int:
        """The most tokens a sequence input takes: the zoo's max_seq, else the first input's axis max (512 if
        unbounded or none)."""
        axes = self.inputs[0].axes if self.inputs else ()
        return self.builder_args.get("max_seq") or (self.axis_range(axes[0])[1] if axes else None) or 512

    def axis_range(self, axis: str) -> tuple[int, int | None]:
        """(min, max) of a named dynamic axis; max None when unbounded."""
        return self.dynamic_axes.get(axis, (1, None))

    def axis_lengths(self, axis: str) -> tuple[int, ...]:
        """Lengths of a dynamic axis that validation runs: its min, max and one between (8 if it fits)."""
        low, high = self.axis_range(axis)
        high = high if high is not None else max(low, 16)
        mid = min(max(8, low), high)
        return tuple(sorted({low, mid, high}))

    def sample_length(self, axis: str) -> int:
        """The length of a dynamic axis in generated sample data: 8 where the range allows."""
        low, high = self.axis_range(axis)
        return min(max(8, low), high) if high is not None else max(8, low)

    @property
    def image_input(self) -> TensorSpec | None:
        """The first input with an image format, if any."""
        return next((t for t in self.inputs if t.image_format), None)

    def to_dict(self) -> dict:
        """Plain, JSON-native form of the spec (lists, not tuples)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def fingerprint(self) -> str:
        """sha256 of the spec's canonical JSON form."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        """Build a spec from its plain form (as written by to_dict or a JSON file)."""
        data = dict(data)
        try:
            data["inputs"] = [TensorSpec(**t) for t in data.get("inputs", [])]
            data["outputs"] = [TensorSpec(**t) for t in data.get("outputs", [])]
            if data.get("preprocessing"):
                data["preprocessing"] = Preprocessing(**data["preprocessing"])
            if "tolerances" in data:
                data["tolerances"] = {k: tuple(v) for k, v in data["tolerances"].items()}
            if "dynamic_axes" in data:
                data["dynamic_axes"] = {k: tuple(v) for k, v in data["dynamic_axes"].items()}
            return cls(**data)
        except TypeError as err:
            raise SpecError(f"model spec is malformed: {err}") from err


def _split_image_dims(image: TensorSpec) -> tuple[int, tuple[int, int]]:
    if image.image_format == "NCHW":
        channels, height, width = image.dims
    else:
        height, width, channels = image.dims
    return channels, (height, width)
