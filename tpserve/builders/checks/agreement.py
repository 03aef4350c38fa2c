"""A quantized variant's every output against the FP32 model's on the same rows, with or without labels.

The figures read as Polygraphy's comparators read two runners' outputs (per output, over the rows given), chosen
for what a quantized model gets wrong: the mean cosine of a row's values (embeddings, regressions, scores alike;
for an output of one value a row, the cosine of the column), the relative error of all of them (L2 of the
difference over L2 of FP32's), and for class scores (an output of one dim wider than 1, in a model that pools no
embedding, not named as an embedding is) the share of rows whose top class agrees. An output of integers is
compared exactly. Each figure is held to the spec's `agreement` for the precision (ModelSpec.agreement, defaults
DEFAULT_AGREEMENT): a variant with one output past one is not written (builders/build.py says which, by how much,
against what, and what to try).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpserve.builders.spec.model_spec import ModelSpec

TINY = 1e-12
EMBEDDING_WORDS = ("embed", "hidden", "pooled", "feature", "vector")  # an output named so is no class scores


@dataclass(frozen=True, kw_only=True)
class OutputFigures:
    """One output of the candidate against FP32's on the same rows. None: the figure does not fit the output."""

    output: str
    kind: str  # "class scores", "values" or "integers"
    rows: int
    cosine: float | None
    worst_row_cosine: float | None
    relative_error: float | None
    top1: float | None
    max_abs: float
    missed: tuple[str, ...]  # the figures past the spec's agreement, as "figure value vs limit"

    @property
    def passed(self) -> bool:
        return not self.missed

    def to_dict(self) -> dict:
        return {**asdict(self), "missed": list(self.missed), "passed": self.passed}


def _kind(spec: ModelSpec, name: str, values) -> str:
    if values.dtype.kind in "iub":
        return "integers"
    tensor = next((t for t in spec.outputs if t.name == name), None)
    dims = tensor.dims if tensor is not None else values.shape[1:]
    wide = len(dims) == 1 and (dims[0] > 1 or (dims[0] == -1 and values.ndim == 2 and values.shape[1] > 1))
    embedding = spec.pooling or any(word in name.lower() for word in EMBEDDING_WORDS)
    return "class scores" if wide and not embedding else "values"


def _figures(reference, candidate) -> dict:
    import numpy as np

    ref = reference.reshape(len(reference), -1).astype(np.float64)
    got = candidate.reshape(len(candidate), -1).astype(np.float64)
    if ref.shape[1] == 1:  # one value a row (a regression): the cosine of the column, all rows as one vector
        ref, got = ref.T, got.T
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1)
    dots = (ref * got).sum(axis=1)
    both_zero = (np.linalg.norm(ref, axis=1) < TINY) & (np.linalg.norm(got, axis=1) < TINY)
    cosines = np.where(both_zero, 1.0, dots / np.maximum(norms, TINY))
    error = float(np.linalg.norm(got - ref) / max(float(np.linalg.norm(ref)), TINY))
    return {"cosine": float(cosines.mean()), "worst_row_cosine": float(cosines.min()), "relative_error": error}


def compare_output(spec: ModelSpec, name: str, reference, candidate, limits: dict) -> OutputFigures:
    """One output's figures (rows first in both arrays) and the limits it missed."""
    import numpy as np

    if reference.shape != candidate.shape:
        return OutputFigures(
            output=name, kind="values", rows=len(reference), cosine=None, worst_row_cosine=None,
            relative_error=None, top1=None, max_abs=float("inf"),
            missed=(f"shape {list(candidate.shape)} vs FP32's {list(reference.shape)}",),
        )  # fmt: skip
    kind = _kind(spec, name, reference)
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    if kind == "integers":
        exact = float((reference == candidate).mean()) if reference.size else 1.0
        unequal: tuple[str, ...] = () if exact == 1.0 else (f"equal values {exact:.3f} vs 1",)
        return OutputFigures(
            output=name, kind=kind, rows=len(reference), cosine=None, worst_row_cosine=None,
            relative_error=None, top1=None, max_abs=max_abs, missed=unequal,
        )  # fmt: skip
    figures = _figures(reference, candidate)
    top1 = None
    if kind == "class scores":
        top1 = float((reference.argmax(axis=1) == candidate.argmax(axis=1)).mean())
    missed: list[str] = []
    if "cosine" in limits and figures["cosine"] < limits["cosine"]:
        missed.append(f"cosine {figures['cosine']:.4f} vs at least {limits['cosine']:g}")
    if "relative_error" in limits and figures["relative_error"] > limits["relative_error"]:
        missed.append(f"relative error {figures['relative_error']:.4f} vs at most {limits['relative_error']:g}")
    if top1 is not None and "top1" in limits and top1 < limits["top1"]:
        missed.append(f"top-1 agreement {top1:.3f} vs at least {limits['top1']:g}")
    return OutputFigures(output=name, kind=kind, rows=len(reference), top1=top1, max_abs=max_abs, missed=tuple(missed),
                         **figures)  # fmt: skip


def compare(spec: ModelSpec, precision: str, reference: dict, candidate: dict) -> list[OutputFigures]:
    """Every output of the spec (by name; rows first), the candidate at precision against FP32's."""
    limits = spec.agreement.get(precision, {})
    names = [t.name for t in spec.outputs if t.name in reference]
    return [compare_output(spec, n, reference[n], candidate[n], limits) for n in names]


def worst_per_output(figures: list[OutputFigures]) -> list[OutputFigures]:
    """One record per output, in the order first seen: the case that missed a limit, else the lowest cosine (the
    largest difference for integers), over several cases of the same outputs (batches, lengths)."""
    chosen: dict[str, OutputFigures] = {}
    for found in figures:
        held = chosen.get(found.output)
        if held is None or _worse(found, held):
            chosen[found.output] = found
    return list(chosen.values())


def _worse(a: OutputFigures, b: OutputFigures) -> bool:
    if a.passed != b.passed:
        return not a.passed
    if a.cosine is not None and b.cosine is not None and a.cosine != b.cosine:
        return a.cosine < b.cosine
    return a.max_abs > b.max_abs


def missed_message(spec: ModelSpec, precision: str, figures: list[OutputFigures], rows: str, report) -> str:
    """What the build says when a variant is not written: which outputs missed, by how much, against what, and
    what to try."""
    missed = "; ".join(f"output {f.output!r} ({f.kind}): {', '.join(f.missed)}" for f in figures if f.missed)
    return (
        f"model {spec.name!r}: the {precision.upper()} variant was not written: against FP32 on {rows}, {missed} "
        f"(every output's figures: {report}). Try: calibration rows like those the model will serve (--calibration "
        f"DIR|FILE.npz; more of them), an input whose values span a much wider range than the others scaled to "
        f"theirs before the model (one scale per activation tensor rounds the small ones to zero), or keep FP32; "
        f"where the difference is expected, loosen the spec's agreement (agreement.{precision} = {{ cosine = ..., "
        f"relative_error = ..., top1 = ... }})"
    )
