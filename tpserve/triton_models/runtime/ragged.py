"""Batching across lengths: the rows of a dynamic batch grouped by length bucket, under a token budget.

Triton's dynamic batcher joins requests of different sequence lengths when the inputs allow ragged batches
(`allow_ragged_batch`); the backend then holds one block per request, each padded to its own longest row.
Here those rows are pooled, sorted by real length (from the attention mask) and cut into groups: every
group runs at one length bucket (the smallest that holds its longest row) and at most the rows that fit the
token budget (rows x length, like TEI's max batch tokens) and the largest batch bucket. Each request gets
back exactly its own rows, in its own order.

Pure numpy: the ONNX Runtime model.py and the torch runtime share it, and the unit tests run it alone.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

DEFAULT_TOKEN_BUDGET = 16384  # TEI's default max batch tokens
MIN_LENGTH_BUCKET = 16


@dataclass(frozen=True)
class LengthGrid:
    """Length buckets x batch buckets, bounded by a token budget: the shapes a model runs at (and, on a GPU,
    the CUDA graphs it captures).

    Args:
        lengths: length buckets, ascending; the last is the longest row served.
        batches: batch buckets (rows per run), ascending, starting at 1.
        token_budget: the most rows x length one run computes (at least one row of the longest length).
    """

    lengths: tuple[int, ...]
    batches: tuple[int, ...]
    token_budget: int = DEFAULT_TOKEN_BUDGET

    def __post_init__(self):
        for name in ("lengths", "batches"):
            values = tuple(getattr(self, name))
            object.__setattr__(self, name, values)
            if not values or list(values) != sorted(set(values)) or values[0] < 1:
                raise ValueError(f"{name} {list(values)} must be distinct positive ints, ascending")
        if self.batches[0] != 1:
            raise ValueError(f"batches {list(self.batches)} must start at 1 (a lone row runs too)")
        if self.token_budget < self.lengths[-1]:
            raise ValueError(
                f"token budget {self.token_budget} is below the longest length {self.lengths[-1]}: "
                "one row of that length must fit"
            )

    @property
    def max_length(self) -> int:
        return self.lengths[-1]

    def rows_for(self, length: int) -> int:
        """The largest batch bucket whose rows at `length` fit the token budget."""
        known = self._rows_at.get(length)
        if known is not None:
            return known
        fitting = [b for b in self.batches if b * length <= self.token_budget]
        return fitting[-1] if fitting else 1

    @cached_property
    def _rows_at(self) -> dict[int, int]:  # rows_for of every length bucket (the plan asks it many times a batch)
        return {n: max([b for b in self.batches if b * n <= self.token_budget], default=1) for n in self.lengths}

    def cells(self) -> list[tuple[int, int]]:
        """Every (rows, length) shape a run may take: batch buckets up to rows_for(length), per length bucket."""
        return [(b, n) for n in self.lengths for b in self.batches if b <= self.rows_for(n)]

    def batch_bucket(self, rows: int) -> int:
        at = bisect.bisect_left(self.batches, rows)
        if at == len(self.batches):
            raise ValueError(f"{rows} rows exceed the largest batch bucket {self.batches[-1]}")
        return self.batches[at]

    def to_params(self) -> dict:
        """The grid as config.pbtxt parameters (strings)."""
        return {
            "length_buckets": " ".join(map(str, self.lengths)),
            "graph_batch_sizes": " ".join(map(str, self.batches)),
            "token_budget": str(self.token_budget),
        }


def length_steps(low: int, high: int) -> tuple[int, ...]:
    """low, then steps of 8 up to 64 and four steps per octave beyond (80, 96, 112, 128, 160, ...), up to high and
    high itself: a row is padded by at most about a fifth of its length (lognormal text lengths near 40 tokens
    computed 0.80 real tokens per computed token in 430-row batches, against 0.75 with two steps per octave)."""
    sizes, size = {high}, low
    while size < high:
        sizes.add(size)
        size += 8 if size < 64 else 1 << (size.bit_length() - 3)
    return tuple(sorted(sizes))


def half_octaves(low: int, high: int) -> tuple[int, ...]:
    """low, 1.5 low, 2 low, 3 low, 4 low, ... up to high, and high itself."""
    sizes, size = {high}, low
    while size < high:
        sizes.update(v for v in (size, size * 3 // 2) if v < high)
        size *= 2
    return tuple(sorted(sizes))


@functools.lru_cache(maxsize=16)  # asked once per batch on the CPU path
def exact_grid(grid: LengthGrid) -> LengthGrid:
    """The grid that groups rows where each group runs at its own longest row (no graphs: the CPU's way): two
    buckets per octave. There a bucket only decides which rows share a run, and finer ones split a dynamic batch
    into more, smaller runs (on 2 cores, ONNX Runtime served single sentences at 86/s with the GPU's quarter
    octaves, against 97/s with half octaves: docs/cpu/text_bench_2core_*.md)."""
    lengths = half_octaves(min(grid.lengths[0], MIN_LENGTH_BUCKET), grid.max_length)
    return LengthGrid(lengths, grid.batches, grid.token_budget)


def batch_steps(high: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 24, ..., 64, 80, ..., 128, 160, ... up to high, and high itself."""
    sizes, size = {high}, 1
    while size < high:
        sizes.add(size)
        size = size * 2 if size < 8 else size + (8 if size < 64 else 16 if size < 128 else 32)
    return tuple(sorted(sizes))


def default_grid(max_length: int, max_rows: int, token_budget: int = 0, lengths=(), batches=()) -> LengthGrid:
    """Length buckets 16, 24, 32, 40, ..., 64, 80, 96, 112, 128, 160, ... up to max_length (length_steps); batch
    buckets 1, 2, 4, 8, then every 8 up to 64, every 16 up to 128 and every 32 beyond, up to max_rows (rows padded
    to their bucket waste at most about an eighth); the token budget max(16,384, max_length) unless given."""
    lengths = tuple(lengths) or length_steps(min(MIN_LENGTH_BUCKET, max_length), max_length)
    batches = tuple(batches) or batch_steps(max_rows)
    return LengthGrid(lengths, batches, token_budget or max(DEFAULT_TOKEN_BUDGET, lengths[-1]))


def grid_from_params(params: dict, max_length: int, max_rows: int) -> LengthGrid:
    """The grid a config's parameters name (length_buckets, graph_batch_sizes, token_budget), else the default."""

    def ints(key):
        return tuple(int(v) for v in str(params.get(key, "")).split())

    return default_grid(
        max_length, max_rows, int(params.get("token_budget") or 0), ints("length_buckets"), ints("graph_batch_sizes")
    )


def row_lengths(mask: np.ndarray) -> np.ndarray:
    """Each row's real length: the position of its last non-zero mask entry, plus one (at least 1)."""
    if mask.ndim != 2:
        raise ValueError(f"an attention mask is [rows, length], got shape {list(mask.shape)}")
    if mask.shape[1] == 0:
        return np.ones(mask.shape[0], np.int64)
    nonzero = mask != 0
    last = mask.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(axis=1), last, 1).astype(np.int64)


@dataclass
class Group:
    """Rows that run together: their indices in the batch's row order, and the length they run at."""

    length: int
    rows: np.ndarray


def plan(lengths: np.ndarray, grid: LengthGrid, min_run_tokens: int = 0) -> list[Group]:
    """Rows sorted by length and cut into runs that fit the budget and the largest batch bucket.

    Neighbouring length buckets may share a run (at the longer length) where that computes fewer tokens:
    each run costs `min_run_tokens` more than its tokens (a GPU takes about as long for a tiny run as for that
    many tokens: kernel launches, not arithmetic), and rows are padded up to their batch bucket. A small dynamic
    program over the length buckets present picks the cheapest grouping (min_run_tokens 0: one group per bucket,
    split by the budget)."""
    if len(lengths) == 0:
        return []
    longest = int(lengths.max())
    if longest > grid.max_length:
        raise ValueError(f"a row of {longest} tokens exceeds the model's longest length {grid.max_length}")
    order = np.argsort(lengths, kind="stable")
    buckets = np.searchsorted(np.asarray(grid.lengths), lengths[order])
    present, counts = np.unique(buckets, return_counts=True)
    ends = np.cumsum(counts)
    groups = []
    for first, last in _cheapest_spans(present, counts, grid, min_run_tokens):
        rows, length = order[(ends[first] - counts[first]) : ends[last]], grid.lengths[present[last]]
        cap = grid.rows_for(length)
        groups += [Group(length, rows[start : start + cap]) for start in range(0, len(rows), cap)]
    return groups


def run_cost(rows: int, length: int, grid: LengthGrid, min_run_tokens: int) -> int:
    """Tokens computed for `rows` rows at `length` (full runs of the budget's rows, then the rest padded to its
    batch bucket), plus min_run_tokens for each run: a run costs its launch and its tokens, a + b * tokens. (A
    floor instead, max(min_run_tokens, tokens), kept too many small runs: batches of 32-256 sentences in arrival
    order ran 1.11-1.34x faster in-process with the sum on an H200 host, docs/gpu/ragged_plan_cost_h200.md.)"""
    cap = grid.rows_for(length)
    full, rest = divmod(rows, cap)
    runs = full + (1 if rest else 0)
    return runs * min_run_tokens + full * cap * length + (grid.batch_bucket(rest) * length if rest else 0)


def _cheapest_spans(present, counts, grid: LengthGrid, min_run_tokens: int) -> list[tuple[int, int]]:
    """(first, last) indices into the buckets present: consecutive spans whose runs cost the fewest tokens."""
    size = len(present)
    if min_run_tokens <= 0:
        return [(k, k) for k in range(size)]
    inf = float("inf")
    best, cut = [0.0] + [inf] * size, [0] * (size + 1)
    before = [0, *np.cumsum(counts).tolist()]  # rows in the buckets before each
    for end in range(1, size + 1):
        length = grid.lengths[present[end - 1]]
        for start in range(end):
            cost = best[start] + run_cost(before[end] - before[start], length, grid, min_run_tokens)
            if cost < best[end]:
                best[end], cut[end] = cost, start
    spans, end = [], size
    while end:
        spans.append((cut[end], end - 1))
        end = cut[end]
    return spans[::-1]


@dataclass
class Counters:
    """What the runs computed: rows, real tokens, tokens computed (with the padding) and runs."""

    rows: int = 0
    real_tokens: int = 0
    computed_tokens: int = 0
    runs: int = 0
    batches: int = 0

    def add(self, lengths: np.ndarray, shapes: list[tuple[int, int]]) -> None:
        self.batches += 1
        self.rows += len(lengths)
        self.real_tokens += int(lengths.sum())
        self.computed_tokens += sum(rows * length for rows, length in shapes)
        self.runs += len(shapes)

    def as_dict(self) -> dict:
        efficiency = self.real_tokens / self.computed_tokens if self.computed_tokens else None
        return {**self.__dict__, "padding_efficiency": efficiency}


class RaggedBatch:
    """The requests of one dynamic batch, their rows pooled: one [total rows, widest] array per input.

    Args:
        feeds: per request, input name -> array [rows, length] (every input of a request has one length).
        names: the inputs, in the model's order.
        mask: the input whose non-zero entries mark real tokens ("" : every row is as long as its request).

    RaggedBatch.pooled() makes one from arrays already pooled (the in-process backend copies Triton's buffers
    straight into them).
    """

    def __init__(self, feeds: list[dict], names: list[str], mask: str = ""):
        sizes, widths = [], []
        for index, feed in enumerate(feeds):
            shapes = {name: feed[name].shape for name in names}
            if len({s for s in shapes.values()}) != 1 or len(next(iter(shapes.values()))) != 2:
                raise ValueError(f"request {index}: inputs must all be [rows, length] of one shape, got {shapes}")
            rows, width = next(iter(shapes.values()))
            sizes.append(rows)
            widths.append(width)
        widest = max(widths, default=0)
        combined = {name: _combine([f[name] for f in feeds], sizes, widths, widest) for name in names}
        self._pool(combined, sizes, widths, names, mask)

    @classmethod
    def pooled(cls, combined: dict, sizes: list[int], widths: list[int], names: list[str], mask: str = ""):
        """A batch of arrays already pooled: request after request, each row zero-padded to the widest."""
        batch = cls.__new__(cls)
        batch._pool(combined, list(sizes), list(widths), names, mask)
        return batch

    def _pool(self, combined, sizes, widths, names, mask) -> None:
        self.combined, self.sizes, self.widths, self.names, self.mask = combined, sizes, widths, list(names), mask
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])  # each request's first row
        if mask:
            self.lengths = row_lengths(combined[mask])
        else:
            self.lengths = np.repeat(np.asarray(widths, np.int64), sizes)

    def rows(self, name: str, group: Group, out: np.ndarray | None = None) -> np.ndarray:
        """The group's rows of one input at the group's length (zero-padded), into `out` when given (its first
        len(group.rows) rows; the caller zeroes any rows beyond)."""
        source = self.combined[name]
        width = min(group.length, source.shape[1])
        if out is None:
            out = np.zeros((len(group.rows), group.length), source.dtype)
        picked = out[: len(group.rows)]
        np.take(source[:, :width], group.rows, axis=0, out=picked[:, :width])
        if width < group.length:
            picked[:, width:] = 0
        return out

    def split(self, outputs: list[np.ndarray], per_token: list[bool]) -> list[list[np.ndarray]]:
        """Outputs in batch row order cut into each request's rows; a per-token output ([rows, widest, ...]) is
        cut to the request's own length as well."""
        return [self.part(outputs, index, per_token) for index in range(len(self.sizes))]

    def part(self, outputs: list[np.ndarray], index: int, per_token: list[bool]) -> list[np.ndarray]:
        """One request's rows of the outputs (in batch row order), as split cuts them."""
        start, rows, width = int(self.starts[index]), self.sizes[index], self.widths[index]
        pieces = (out[start : start + rows] for out in outputs)
        return [np.ascontiguousarray(p[:, :width] if tokens else p) for p, tokens in zip(pieces, per_token)]

    def place(self, results: list | None, group: Group, outputs: list[np.ndarray], per_token: list[bool]) -> list:
        """A group's outputs written into the batch's outputs (made at the first group) at the group's rows."""
        total, widest = len(self.lengths), max(self.widths)
        if results is None:
            results = [
                np.zeros((total, widest, *o.shape[2:]) if tokens else (total, *o.shape[1:]), o.dtype)
                for o, tokens in zip(outputs, per_token)
            ]
        for result, out, tokens in zip(results, outputs, per_token):
            out = out[: len(group.rows)]
            if tokens:
                width = min(widest, out.shape[1])
                result[group.rows, :width] = out[:, :width]
            else:
                result[group.rows] = out
        return results


def _combine(parts: list[np.ndarray], sizes, widths, widest: int) -> np.ndarray:
    out = np.zeros((sum(sizes), widest), parts[0].dtype if parts else np.int64)
    start = 0
    for part, rows, width in zip(parts, sizes, widths):
        out[start : start + rows, :width] = part
        start += rows
    return out


def run_exact(batch: RaggedBatch, grid: LengthGrid, run, per_token: list[bool], counters: Counters | None = None):
    """Each group run at its own longest row rounded up to 8 (no graphs, so no padding to the bucket: the CPU's
    way); run(list of input arrays) returns the outputs. Returns each request's outputs."""
    return batch.split(run_pooled(batch, grid, run, per_token, counters), per_token)


def run_answering(batch: RaggedBatch, grid: LengthGrid, run, per_token: list[bool], answer) -> None:
    """run_exact, where each request is answered, answer(index, its outputs), as soon as its last row has run.
    Groups run shortest first, so a short request does not wait for the batch's long ones.

    Raises:
        ValueError: a request without rows (it would never be answered): use run_exact.
    """
    if 0 in batch.sizes:
        raise ValueError("a request without rows: answer the batch at once (run_exact)")
    owner = np.repeat(np.arange(len(batch.sizes)), batch.sizes)
    left = np.asarray(batch.sizes, np.int64).copy()

    def after_group(rows, results):
        ran = owner[rows]
        np.subtract.at(left, ran, 1)
        for index in np.unique(ran):
            if left[index] == 0:
                answer(int(index), batch.part(results, int(index), per_token))

    run_pooled(batch, grid, run, per_token, after_group=after_group)


def run_pooled(
    batch: RaggedBatch, grid: LengthGrid, run, per_token: list[bool], counters: Counters | None = None, after_group=None
):
    """run_exact's outputs before the split: one array per output in the batch's row order. Groups run shortest
    first; after_group(rows, outputs so far), when given, is called once each group's rows are in place."""
    groups, results, shapes = plan(batch.lengths, exact_grid(grid)), None, []
    for group in groups:
        longest = int(batch.lengths[group.rows].max())
        exact = Group(min(-(-longest // 8) * 8, group.length), group.rows)
        outputs = run([batch.rows(name, exact) for name in batch.names])
        results = batch.place(results, exact, [np.asarray(o) for o in outputs], per_token)
        shapes.append((len(group.rows), exact.length))
        if after_group is not None:
            after_group(group.rows, results)
    if counters is not None:
        counters.add(batch.lengths, shapes)
    return results
