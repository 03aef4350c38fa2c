"""Sentence-length workloads for text models: what a search or embedding service sends.

A workload is a length distribution (seeded lognormal, median about 40 tokens, clipped to the model's
longest; or every sentence the same length) and a number of sentences per request. From it come token-id
batches (each request padded to its own longest sentence, the mask marking real tokens), texts that
tokenize to about those lengths, and perf_analyzer input-data files, so every tool measures the same shapes
and every report can say which.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpserve.common.errors import MeasurementError

CLS, SEP, FIRST_WORDPIECE = 101, 102, 1996  # BERT uncased: [CLS], [SEP], the first ordinary wordpiece
WORDS = tuple(
    (
        "the model serves every request on the graphics card while the server groups sentences of many "
        "lengths into one run so that search and ranking stay fast for all users today"
    ).split()
)  # each one wordpiece in BERT's uncased vocabulary


@dataclass(frozen=True)
class Lengths:
    """Sentence lengths in tokens ([CLS] and [SEP] included).

    Args:
        fixed: every sentence this long (0: lognormal).
        median: the lognormal's median; sigma its shape (0.8: mean ~1.38 x median, p95 ~3.7 x median).
        longest: lengths are clipped to this (the model's longest sequence); shortest: and to at least this.
        seed: the generator's seed: the same workload gives the same lengths everywhere.
    """

    fixed: int = 0
    median: float = 40.0
    sigma: float = 0.8
    longest: int = 256
    shortest: int = 3
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.shortest <= self.longest or self.fixed < 0 or self.fixed > self.longest:
            raise MeasurementError(
                f"sentence lengths: fixed {self.fixed}, shortest {self.shortest}, longest {self.longest}: need "
                "1 <= shortest <= longest and 0 <= fixed <= longest"
            )

    @classmethod
    def parse(cls, text: str, longest: int = 256, seed: int = 0, shortest: int = 3) -> Lengths:
        """'lognormal' (median 40), 'lognormal:MEDIAN' or 'fixed:N'."""
        kind, _, value = text.partition(":")
        try:
            if kind == "fixed":
                return cls(fixed=int(value), longest=longest, shortest=min(shortest, longest), seed=seed)
            if kind == "lognormal":
                return cls(median=float(value or 40), longest=longest, shortest=min(shortest, longest), seed=seed)
        except ValueError:
            pass
        raise MeasurementError(f"lengths {text!r}: use 'lognormal', 'lognormal:MEDIAN' or 'fixed:N'")

    def sample(self, count: int) -> np.ndarray:
        """count lengths (int64), the same for the same seed."""
        if self.fixed:
            return np.full(count, self.fixed, np.int64)
        rng = np.random.default_rng(self.seed)
        drawn = np.round(rng.lognormal(np.log(self.median), self.sigma, count))
        return np.clip(drawn, self.shortest, self.longest).astype(np.int64)

    def describe(self) -> str:
        if self.fixed:
            return f"all {self.fixed} tokens"
        return (
            f"lognormal, median {self.median:g} tokens, sigma {self.sigma:g}, "
            f"clipped to {self.shortest}..{self.longest} (seed {self.seed})"
        )


def summary(lengths: np.ndarray) -> dict:
    """median, mean, p95 and max of a set of lengths."""
    return {
        "sentences": int(len(lengths)),
        "median": float(np.median(lengths)),
        "mean": round(float(np.mean(lengths)), 1),
        "p95": float(np.percentile(lengths, 95)),
        "max": int(np.max(lengths)),
    }


def token_rows(
    lengths: np.ndarray, seed: int = 0, vocab: int = 30522, ids_range: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """ids and mask [rows, longest] (int64), zeros past each length (the mask a prefix mask). ids_range: the
    model's own value_range of its ids, [low, high), drawn uniformly; without one, BERT's: [CLS] random wordpieces
    of a `vocab`-word vocabulary [SEP]."""
    rng = np.random.default_rng(seed)
    rows, width = len(lengths), int(lengths.max())
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    if ids_range is not None:  # the model's own ids: nothing of BERT assumed
        low, high = int(ids_range[0]), int(ids_range[1])
        return (rng.integers(low, max(high, low + 1), (rows, width)) * mask).astype(np.int64), mask
    ids = rng.integers(FIRST_WORDPIECE, vocab, (rows, width)) * mask
    ids[:, 0] = CLS
    ids[np.arange(rows), lengths - 1] = SEP
    return ids.astype(np.int64), mask


def requests(
    lengths: np.ndarray, per_request: int, seed: int = 0, ids_range: tuple[int, int] | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The sentences cut into requests of per_request rows, each padded to its own longest sentence."""
    return [
        token_rows(lengths[start : start + per_request], seed + start, ids_range=ids_range)
        for start in range(0, len(lengths) - per_request + 1, per_request)
    ]


def texts(lengths: np.ndarray, seed: int = 0, words: tuple[str, ...] = WORDS, zipf: float = 0.0) -> list[str]:
    """Sentences of about `lengths` tokens each (words of one wordpiece; [CLS] and [SEP] counted). words: drawn
    uniformly, or with zipf > 0 the i-th word of the list with weight 1 / i**zipf (as words are in real text)."""
    rng = np.random.default_rng(seed)
    weights = None
    if zipf > 0:
        weights = 1.0 / np.arange(1, len(words) + 1) ** zipf
        weights /= weights.sum()
    return [" ".join(rng.choice(words, max(int(n) - 2, 1), p=weights)) for n in lengths]


def vocabulary(tokenizer_json: Path) -> tuple[str, ...]:
    """A WordPiece tokenizer's whole words of one wordpiece (lowercase letters, 2 or more), in id order."""
    vocab = json.loads(Path(tokenizer_json).read_text())["model"]["vocab"]
    found = sorted((i, w) for w, i in vocab.items() if len(w) > 1 and w.isascii() and w.isalpha() and w.islower())
    return tuple(w for _, w in found)


def perf_input_data(
    lengths: np.ndarray,
    per_request: int,
    path: Path,
    names=("input_ids", "attention_mask"),
    text: bool = False,
    words: tuple = (WORDS, 0.0),
    ids_range: tuple[int, int] | None = None,
) -> Path:
    """perf_analyzer --input-data JSON: one entry per sentence, `per_request` consecutive entries per request,
    each request's sentences padded to its longest (as a client batching them would); names: the token
    inputs (see token_arrays). text: one TEXT (BYTES) entry per sentence instead, its texts made of words (texts()'s
    words and zipf).

    perf_analyzer builds a request of batch b from b consecutive entries and needs them to share one shape
    (it checks every window of b, so only per_request 1 or one common width can vary between requests).
    """
    entries = []
    for start in range(0, len(lengths) - per_request + 1, per_request):
        group = lengths[start : start + per_request]
        if text:
            entries += [{"TEXT": _bytes_entry(sentence)} for sentence in texts(group, start, *words)]
            continue
        arrays = token_arrays(names, *token_rows(group, start, ids_range=ids_range))
        for row in range(len(group)):
            entries.append({n: {"content": a[row].tolist(), "shape": [a.shape[1]]} for n, a in arrays.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": entries}))
    return path


def token_arrays(names, ids: np.ndarray, mask: np.ndarray) -> dict:
    """Each token input's array by its name: '*mask*' the mask, '*type*' zeros (segment 0), any other the ids."""
    return {n: mask if "mask" in n else np.zeros_like(ids) if "type" in n else ids for n in names}


def _bytes_entry(sentence: str) -> dict:
    import base64
    import struct

    blob = sentence.encode()
    return {"b64": base64.b64encode(struct.pack("<I", len(blob)) + blob).decode(), "shape": [1]}


def workload_data(
    model_plan, lengths: Lengths, batch: int, path: Path, count: int = 512, spec=None
) -> tuple[Path, str]:
    """perf_analyzer input data for a token or text model under a length distribution, and what it holds.

    Batch 1: each request one sentence at its own length. Larger batches: perf_analyzer needs the rows of a
    request to share one shape, so every sentence is padded to the workload's longest (the mask marks the
    real tokens), as a client padding to a fixed length does; the description says so.
    """
    drawn = lengths.sample(count)
    names = tuple(t.name for t in model_plan.inputs if not t.optional)
    if model_plan.text_input:
        return perf_input_data(drawn, 1, path, text=True), f"TEXT: {lengths.describe()}"
    ids = spec_ids_range(spec, model_plan)
    if batch == 1:
        made = perf_input_data(drawn, 1, path, names, ids_range=ids)
        return made, f"{', '.join(names)}: {lengths.describe()}, one per request"
    path = perf_input_data(drawn, count, path, names, ids_range=ids)  # one group: every row padded to the longest
    return path, f"{', '.join(names)}: {lengths.describe()}, rows padded to {int(drawn.max())}"


def workload_requests(model_plan, spec, lengths: str, batch: int, seed: int, count: int = 256) -> list[dict] | None:
    """`count` requests of `batch` sentences for a token or text model (clients.model_plan), drawn from a length
    distribution ('lognormal', 'fixed:N'; clipped to the spec's sequence axis where our spec is known), each
    padded to its own longest; None for other models."""
    if not (model_plan.token_inputs or model_plan.text_input):
        return None
    given = Lengths.parse(
        lengths, longest=spec_longest(spec, model_plan), shortest=spec_shortest(spec, model_plan), seed=seed
    )
    drawn = given.sample(count * batch)
    if model_plan.text_input:
        made = texts(drawn, seed)
        return [
            {"TEXT": np.array([[t.encode()] for t in made[i : i + batch]], dtype=object)}
            for i in range(0, len(made), batch)
        ]
    names = [t.name for t in model_plan.inputs if not t.optional]
    rows = requests(drawn, batch, seed, ids_range=spec_ids_range(spec, model_plan))
    return [token_arrays(names, ids, mask) for ids, mask in rows]


def spec_ids_range(spec, model_plan=None) -> tuple[int, int] | None:
    """The value_range of the model's ids (its first integer input that is not a mask or segment): from our spec
    where it is known, else from the config's declaration (model_plan.checks); None where neither declares one
    (then BERT-like ids)."""
    if spec is None:
        checks = model_plan.checks if model_plan is not None else None
        if checks is None:
            return None
        names = [t.name for t in model_plan.inputs if not t.optional]
        ids = [checks.ranges[n] for n in names if n in checks.ranges and not _mask_or_segment(n)]
        return (int(ids[0][0]), int(ids[0][1])) if ids else None
    for tensor in spec.inputs:
        if _mask_or_segment(tensor.name) or tensor.dtype not in ("INT64", "INT32"):
            continue
        return (int(tensor.value_range[0]), int(tensor.value_range[1])) if tensor.value_range else None
    return None


def _mask_or_segment(name: str) -> bool:
    return "mask" in name.lower() or "type" in name.lower()


def _axis_range(spec, model_plan) -> tuple[int, int | None] | None:
    """(shortest, longest) of the sequence axis: our spec's first input's, else the config's declaration."""
    axes = spec.inputs[0].axes if spec is not None and spec.inputs else ()
    if axes:
        return spec.axis_range(axes[0])
    checks = model_plan.checks if spec is None and model_plan is not None else None
    if checks is None:
        return None
    first = next((t.name for t in model_plan.inputs if not t.optional), None)
    named = [a for a in checks.axes.get(first, []) if a is not None] if first else []
    return tuple(checks.lengths.get(named[0], (1, None))) if named else None


def spec_shortest(spec, model_plan=None) -> int:
    """The shortest sequence to draw: the declared axis minimum where it is above 3 (room for [CLS] and [SEP]),
    3 otherwise (less where the axis' maximum is); 3 for models that declare none."""
    found = _axis_range(spec, model_plan)
    if not found:
        return 3
    low, high = found
    return max(low, min(3, high or 3))


def spec_longest(spec, model_plan=None) -> int:
    """The longest sequence the declared axis allows (at most 512); 256 for models that declare none."""
    found = _axis_range(spec, model_plan)
    return min((found[1] if found else None) or 256, 512)
