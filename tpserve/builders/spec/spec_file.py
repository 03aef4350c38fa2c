"""The spec file: users' own models declared in TOML, validated field by field on load.

    [[model]]
    name = "acme_classifier"
    factory = "acme_models.vision:build"       # or exported = "model.pt2", or onnx = "model.onnx"
    factory_args = { num_classes = 5 }
    checkpoint = "weights/acme.pt"
    python_path = ["src"]
    max_batch_size = 16
    inputs  = [ { name = "image", dtype = "FP32", dims = [3, 32, 32] } ]
    outputs = [ { name = "logits", dtype = "FP32", dims = [5] } ]

docs/building.md lists every field. Paths are relative to the spec file and must stay inside its
folder. Every error names the file, the model and the field, and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from tpserve.builders.repository.writer import ServingOptions
from tpserve.builders.spec import user_models
from tpserve.builders.spec.model_spec import (
    AGREEMENT_FIGURES,
    DEFAULT_AGREEMENT,
    DEFAULT_TOLERANCES,
    DTYPES,
    IMAGE_FORMATS,
    PRECISIONS,
    ModelSpec,
    Preprocessing,
    TensorSpec,
)
from tpserve.common.errors import SpecError

SOURCES = ("factory", "exported", "onnx")
MODEL_FIELDS = {
    "name",
    "factory",
    "exported",
    "onnx",
    "factory_args",
    "checkpoint",
    "python_path",
    "max_batch_size",
    "inputs",
    "outputs",
    "labels",
    "labels_file",
    "preprocessing",
    "dynamic_axes",
    "validation_batch_sizes",
    "tolerances",
    "agreement",
    "opset",
    "precisions",
    "calibration",
    "eval_data",
    "serving",
    "pipelines",
    "pooling",
    "tokenizer",
}
TENSOR_FIELDS = {"name", "dtype", "dims", "image_format", "value_range", "finite"}
SERVING_FIELDS = {
    "instances",
    "kind",
    "max_queue_delay_us",
    "max_queue_size",
    "queue_timeout_ms",
    "preferred_batch_sizes",
    "dynamic_batching",
    "warmup_batch_sizes",
    "response_cache",
    "intra_op_threads",
    "ragged_batching",
}
PREPROCESSING_FIELDS = {"image_size", "mean", "std"}
KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO")


@dataclass(frozen=True)
class UserModel:
    """One model of a spec file: its spec, and how to build and serve it."""

    spec: ModelSpec
    precisions: tuple[str, ...] = ("fp32",)
    calibration: Path | None = None
    eval_data: Path | None = None
    serving: ServingOptions = field(default_factory=ServingOptions)
    pipelines: bool = True


class _Model:
    """Reads one [[model]] table; errors carry the file, the model and the field."""

    def __init__(self, table: dict, index: int, path: Path):
        self.table, self.path, self.folder = table, path, path.parent
        name = table.get("name")
        self.label = f"{path}: model {name!r}" if isinstance(name, str) else f"{path}: model #{index + 1}"

    def fail(self, key: str, problem: str, fix: str) -> SpecError:
        return SpecError(f"{self.label}: field {key!r}: {problem}; {fix}")

    def get(self, key: str, kinds, default=None, required=False):
        if key not in self.table:
            if required:
                raise self.fail(key, "is missing", f"add {key} = ... (see docs/building.md, 'Your own models')")
            return default
        value = self.table[key]
        if not isinstance(value, kinds) or isinstance(value, bool) and bool not in _tuple(kinds):
            raise self.fail(key, f"{value!r} is a {type(value).__name__}", f"give a {_names(kinds)}")
        return value

    def local_path(self, key: str, value: str, must_exist: bool = True) -> Path:
        """A path relative to the spec file, kept inside its folder (symlinks inside it are fine)."""
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"{value!r} is not a path", "give a path relative to the spec file")
        folder = Path(os.path.normpath(self.folder.absolute()))  # a spec given as ../models/models.toml
        joined = Path(os.path.normpath(folder / value))
        if not joined.is_relative_to(folder):
            raise self.fail(
                key,
                f"{value!r} resolves outside the spec file's folder {self.folder}",
                "keep models, checkpoints and data in that folder (or a link inside it)",
            )
        if must_exist and not joined.exists():
            raise self.fail(key, f"{joined} does not exist", "check the path (relative to the spec file)")
        return joined


def _tuple(kinds) -> tuple:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _names(kinds) -> str:
    return " or ".join(
        {int: "integer", float: "number", str: "string", list: "list", dict: "table", bool: "true/false"}[k]
        for k in _tuple(kinds)
    )


def load(path: Path) -> list[UserModel]:
    """Every model of a spec file, validated.

    Raises:
        SpecError: the file is missing or not TOML, or a field is invalid (file, model and field named).
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise SpecError(f"spec file {path} cannot be read: {err}") from err
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"spec file {path} is not valid TOML: {err}") from err
    unknown = sorted(set(data) - {"model"})
    tables = data.get("model")
    if unknown or not isinstance(tables, list) or not tables:
        raise SpecError(
            f"spec file {path}: expected one or more [[model]] tables"
            + (f", found other top-level keys {unknown}" if unknown else "")
        )
    models = [read_model(table, i, path) for i, table in enumerate(tables)]
    names = [m.spec.name for m in models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SpecError(f"spec file {path}: model names must be unique, repeated: {dupes}; rename one of them")
    return models


def read_model(table: dict, index: int, path: Path) -> UserModel:
    """One [[model]] table as a UserModel."""
    m = _Model(table, index, path)
    unknown = sorted(set(table) - MODEL_FIELDS)
    if unknown:
        raise m.fail(unknown[0], "is not a known field", f"known fields: {', '.join(sorted(MODEL_FIELDS))}")
    builder, args = _source(m)
    if "tokenizer" in table:
        args["tokenizer"] = str(m.local_path("tokenizer", table["tokenizer"]))
    spec = _spec(m, builder, args)
    _check_tokenizer(m, spec)
    precisions = tuple(_strings(m, "precisions", ["fp32"]))
    if "fp32" not in precisions or not set(precisions) <= {"fp32", "int8"}:
        raise m.fail(
            "precisions",
            f"{list(precisions)} is not supported",
            'give ["fp32"] or ["fp32", "int8"] (fp16 plans come from the TensorRT build)',
        )
    data = {k: m.local_path(k, table[k]) if k in table else None for k in ("calibration", "eval_data")}
    serving = _serving(m)
    _check_config(m, spec, serving)
    return UserModel(spec, precisions, data["calibration"], data["eval_data"], serving, m.get("pipelines", bool, True))


def _check_tokenizer(m: _Model, spec: ModelSpec) -> None:
    """A tokenizer makes <model>_pipeline (TEXT in): the model must take token ids and a mask, one sequence each."""
    from tpserve.builders.repository.writer import ragged_inputs

    if "tokenizer" not in spec.builder_args:
        return
    names = [t.name for t in spec.inputs]
    if len(names) != 2 or not ragged_inputs(spec) or "mask" not in names[1]:
        raise m.fail(
            "tokenizer",
            f"a text pipeline feeds token ids and an attention mask; the inputs are {names} with dims "
            f"{[list(t.dims) for t in spec.inputs]}",
            'declare two inputs of dims ["seq"], ids first, then one named like "attention_mask"; or remove tokenizer',
        )


def _check_config(m: _Model, spec: ModelSpec, serving: ServingOptions) -> None:
    """Build the Triton config now, so a bad serving option fails on load, naming the field."""
    from tpserve.builders.repository.writer import model_config
    from tpserve.common.errors import ConfigError

    try:
        model_config(spec, "embedded", serving)
    except ConfigError as err:
        raise m.fail("serving", str(err), "fix the serving table") from err


def _source(m: _Model) -> tuple[str, dict]:
    given = [k for k in SOURCES if k in m.table]
    if len(given) != 1:
        raise m.fail(
            "factory",
            f"{'none' if not given else ' and '.join(given)} of factory/exported/onnx given",
            'give exactly one: factory = "package.module:callable", exported = "model.pt2" or onnx = "model.onnx"',
        )
    origin = {"spec_file": str(m.path)}
    if given[0] != "factory":
        for key in ("factory_args", "checkpoint", "python_path"):
            if key in m.table:
                raise m.fail(key, f"only applies to a factory, not to {given[0]}", f"remove {key}")
        file = m.local_path(given[0], m.table[given[0]])
        from tpserve.builders.formats.export import file_sha256

        builder = user_models.EXPORTED if given[0] == "exported" else user_models.ONNX
        return builder, {**origin, given[0]: str(file), "sha256": file_sha256(file)}
    return user_models.FACTORY, {**origin, **_factory_args(m)}


def _factory_args(m: _Model) -> dict:
    target = m.get("factory", str)
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise m.fail(
            "factory",
            f"{target!r} is not 'package.module:callable'",
            'write it like "torchvision.models:mobilenet_v3_small"',
        )
    args = {
        "factory": target,
        "factory_args": m.get("factory_args", dict, {}),
        "python_path": [str(m.local_path("python_path", p)) for p in _strings(m, "python_path", [])],
    }
    if "checkpoint" in m.table:
        from tpserve.builders.formats.export import file_sha256

        checkpoint = m.local_path("checkpoint", m.table["checkpoint"])
        args.update(checkpoint=str(checkpoint), checkpoint_sha256=file_sha256(checkpoint))
    return args


def _strings(m: _Model, key: str, default: list) -> list:
    values = m.get(key, list, default)
    if not all(isinstance(v, str) for v in values):
        raise m.fail(key, f"{values!r} is not a list of strings", f'write {key} = ["...", ...]')
    return values


def _spec(m: _Model, builder: str, args: dict) -> ModelSpec:
    inputs = _tensors(m, "inputs")
    outputs = _tensors(m, "outputs")
    fields = dict(
        name=m.get("name", str, required=True),
        builder=builder,
        builder_args=args,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=m.get("max_batch_size", int, required=True),
        labels=_labels(m),
        preprocessing=_preprocessing(m, inputs),
        pooling=m.get("pooling", str, ""),
    )
    fields.update(_checks(m))
    try:
        return ModelSpec(**fields)
    except SpecError as err:
        raise SpecError(f"{m.label}: {err}") from err


def _checks(m: _Model) -> dict:
    out: dict[str, Any] = {}
    if "validation_batch_sizes" in m.table:
        sizes = m.get("validation_batch_sizes", list)
        if not sizes or not all(isinstance(b, int) and not isinstance(b, bool) for b in sizes):
            raise m.fail("validation_batch_sizes", f"{sizes!r} is not a list of integers", "e.g. [1, 4, 16]")
        out["validation_batch_sizes"] = tuple(sizes)
    else:
        top = m.table.get("max_batch_size")
        out["validation_batch_sizes"] = tuple(sorted({1, 3, top})) if isinstance(top, int) and top >= 3 else (1,)
    if "tolerances" in m.table:
        out["tolerances"] = _tolerances(m)
    if "agreement" in m.table:
        out["agreement"] = _agreement(m)
    if "dynamic_axes" in m.table:
        out["dynamic_axes"] = _dynamic_axes(m)
    if "opset" in m.table:
        out["opset"] = m.get("opset", int)
    return out


def _tolerances(m: _Model) -> dict:
    table = m.get("tolerances", dict)
    tolerances = dict(DEFAULT_TOLERANCES)
    for precision, pair in table.items():
        ok = precision in PRECISIONS and isinstance(pair, list) and len(pair) == 2
        if not ok or not all(isinstance(v, (int, float)) and v >= 0 for v in pair):
            raise m.fail(
                f"tolerances.{precision}",
                f"{pair!r} is invalid",
                f"give {{ fp32 = [atol, rtol] }} with precisions among {PRECISIONS}, values >= 0",
            )
        tolerances[precision] = (float(pair[0]), float(pair[1]))
    return tolerances


def _agreement(m: _Model) -> dict:
    table = m.get("agreement", dict)
    agreement = {k: dict(v) for k, v in DEFAULT_AGREEMENT.items()}
    for precision, figures in table.items():
        ok = precision in PRECISIONS and isinstance(figures, dict) and set(figures) <= set(AGREEMENT_FIGURES)
        values = figures.values() if ok else ()
        numbers = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values)
        if not numbers:
            raise m.fail(
                f"agreement.{precision}",
                f"{figures!r} is invalid",
                "give { int8 = { cosine = 0.99, relative_error = 0.15, top1 = 0.9 } } (any of the three)",
            )
        agreement[precision] = {**agreement.get(precision, {}), **{k: float(v) for k, v in figures.items()}}
    return agreement


def _dynamic_axes(m: _Model) -> dict:
    table = m.get("dynamic_axes", dict)
    for axis, pair in table.items():
        ok = isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, int) for v in pair)
        if not ok or not 1 <= pair[0] <= pair[1]:
            raise m.fail(f"dynamic_axes.{axis}", f"{pair!r} is invalid", "give [min, max] with 1 <= min <= max")
    return {k: tuple(v) for k, v in table.items()}


def _tensors(m: _Model, key: str) -> tuple[TensorSpec, ...]:
    items = m.get(key, list, required=True)
    if not items:
        raise m.fail(
            key, "is empty", f"list at least one tensor: {key} = [ {{ name = ..., dtype = ..., dims = ... }} ]"
        )
    return tuple(_tensor(m, f"{key}[{i}]", item) for i, item in enumerate(items))


def _tensor(m: _Model, key: str, item) -> TensorSpec:
    if not isinstance(item, dict):
        raise m.fail(key, f"{item!r} is not a table", "write { name = ..., dtype = ..., dims = [...] }")
    unknown = sorted(set(item) - TENSOR_FIELDS)
    if unknown:
        raise m.fail(f"{key}.{unknown[0]}", "is not a known field", f"known: {', '.join(sorted(TENSOR_FIELDS))}")
    missing = [f for f in ("name", "dtype", "dims") if f not in item]
    if missing:
        raise m.fail(f"{key}.{missing[0]}", "is missing", "each tensor needs name, dtype and dims")
    if item["dtype"] not in DTYPES:
        raise m.fail(f"{key}.dtype", f"{item['dtype']!r} is not a Triton dtype", f"use one of {sorted(DTYPES)}")
    dims, axes = _dims(m, key, item["dims"])
    if item.get("image_format") is not None and item["image_format"] not in IMAGE_FORMATS:
        raise m.fail(f"{key}.image_format", f"{item['image_format']!r} is unknown", f"use one of {IMAGE_FORMATS}")
    if not isinstance(item.get("finite", False), bool):
        raise m.fail(f"{key}.finite", f"{item['finite']!r} is not true or false", "write finite = true")
    try:
        return TensorSpec(
            item["name"], item["dtype"], dims, item.get("image_format"), axes, item.get("value_range"),
            item.get("finite", False),
        )  # fmt: skip
    except SpecError as err:
        raise m.fail(key, str(err), "see docs/building.md, 'Your own models'") from err


def _dims(m: _Model, key: str, dims) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """[3, -1, "seq"]: ints are fixed (-1 dynamic, its own axis); a string is a named dynamic axis."""
    ok = isinstance(dims, list) and dims and all(isinstance(d, (int, str)) and not isinstance(d, bool) for d in dims)
    if not ok or any(isinstance(d, int) and d < 1 and d != -1 for d in dims):
        raise m.fail(
            f"{key}.dims",
            f"{dims!r} is invalid",
            'give per-sample dims (no batch axis): positive ints, -1 or an axis name like "seq"',
        )
    name = key.replace("[", "_").replace("]", "").replace(".", "_")
    axes = tuple(
        d if isinstance(d, str) else f"{name}_d{i}" for i, d in enumerate(dims, 1) if d == -1 or isinstance(d, str)
    )
    return tuple(-1 if isinstance(d, str) else d for d in dims), axes


def _labels(m: _Model) -> tuple[str, ...]:
    if "labels" in m.table and "labels_file" in m.table:
        raise m.fail("labels_file", "is given together with labels", "give one of them")
    if "labels_file" in m.table:
        lines = m.local_path("labels_file", m.table["labels_file"]).read_text().splitlines()
        return tuple(line.strip() for line in lines if line.strip())
    return tuple(_strings(m, "labels", []))


def _preprocessing(m: _Model, inputs: tuple[TensorSpec, ...]) -> Preprocessing | None:
    table = m.get("preprocessing", dict)
    if table is None:
        return None
    unknown = sorted(set(table) - PREPROCESSING_FIELDS)
    if unknown:
        raise m.fail(f"preprocessing.{unknown[0]}", "is not a known field", f"known: {sorted(PREPROCESSING_FIELDS)}")
    image = next((t for t in inputs if t.image_format), None)
    if image is None:
        raise m.fail(
            "preprocessing",
            "is given but no input has an image_format",
            'set image_format = "NCHW" (or "NHWC") on the image input',
        )
    channels = image.dims[0] if image.image_format == "NCHW" else image.dims[2]
    size = list(image.dims[1:] if image.image_format == "NCHW" else image.dims[:2])
    try:
        return Preprocessing(
            tuple(table.get("image_size", size)),
            channels,
            tuple(table.get("mean", [0.0] * channels)),
            tuple(table.get("std", [1.0] * channels)),
        )
    except (SpecError, TypeError) as err:
        raise m.fail("preprocessing", str(err), "give image_size = [H, W], mean and std per channel") from err


def _serving(m: _Model) -> ServingOptions:
    table = m.get("serving", dict, {})
    unknown = sorted(set(table) - SERVING_FIELDS)
    if unknown:
        raise m.fail(f"serving.{unknown[0]}", "is not a known field", f"known: {', '.join(sorted(SERVING_FIELDS))}")
    if table.get("kind", "KIND_CPU") not in KINDS:
        raise m.fail("serving.kind", f"{table['kind']!r} is unknown", f"use one of {KINDS}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}
    switches = {f.name for f in dataclasses.fields(ServingOptions) if isinstance(f.default, bool)}
    for name in sorted(switches & set(values)):
        if not isinstance(values[name], bool):
            raise m.fail(f"serving.{name}", f"{values[name]!r} is not true or false", f"write {name} = true or false")
    try:
        return ServingOptions(**values)
    except (TypeError, ValueError) as err:
        raise m.fail("serving", str(err), "see docs/building.md, 'Your own models'") from err
