"""Serving settings picked from recorded traffic (`make build-engines SHAPES_FROM=<recording or workload>`).

From a model's recorded shape histogram and its peak request rate:
- length buckets (sequence models): the buckets, on multiples of 8 plus the longest length, that pad the recorded
  lengths least (an exact choice over the histogram); they are the CUDA graphs' lengths and TensorRT's profiles;
- the dynamic batcher's queue delay: about two requests' gaps at the peak rate, within 100 µs .. 5 ms, so that
  a batch gathers at the peak and a lone request waits little;
- the preferred batch size: the rows a batch gathers at the peak ((1 + requests per delay) x the recorded 99th
  percentile of rows per request), within max_batch_size (none where that is 1: a preferred 1 would dispatch
  every lone request at once); CUDA-graph batch sizes up to twice that, for bursts.
Each choice comes with the figures it was made from (padding efficiency before and after, rates, rows).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

MIN_DELAY_US, MAX_DELAY_US = 100, 5000
LENGTH_STEP = 8


@dataclass(frozen=True, kw_only=True)
class Tuning:
    """What the traffic says to build for one model."""

    model: str
    requests: int
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    graph_batch_sizes: tuple[int, ...] = ()
    length_buckets: tuple[int, ...] = ()
    figures: dict = field(default_factory=dict)


def tune(spec, histogram: Counter, peak_rate: float, buckets: int = 15) -> Tuning | None:
    """The tuning of a spec from its recorded histogram (None: no recorded request)."""
    total = sum(histogram.values())
    if not total:
        return None
    rows = _rows_per_request(spec, histogram)
    gap_us = 1e6 / peak_rate if peak_rate > 0 else MAX_DELAY_US
    delay = int(min(MAX_DELAY_US, max(MIN_DELAY_US, 2 * gap_us)))
    batch_rows = _gathered_rows(rows, delay, peak_rate, spec.max_batch_size)
    preferred = (batch_rows,) if batch_rows > 1 else ()  # a preferred 1 would send every lone request at once
    figures: dict[str, object] = {
        "peak_requests_per_s": round(peak_rate, 2),
        "rows_per_request_p50": _quantile(rows, 0.5),
        "rows_per_request_p99": _quantile(rows, 0.99),
        "rows_per_batch_at_peak": batch_rows,
    }
    lengths = _lengths(spec, histogram)
    chosen: tuple[int, ...] = ()
    if lengths:
        longest = int(spec.longest_sequence())
        chosen = choose_length_buckets(lengths, longest, buckets)
        default = _default_buckets(longest)
        figures |= {
            "padding_efficiency_default": round(padding_efficiency(lengths, default), 4),
            "padding_efficiency_tuned": round(padding_efficiency(lengths, chosen), 4),
            "default_length_buckets": list(default),
        }
    graphs = tuple(b for b in _batch_steps(2 * batch_rows) if b <= max(1, spec.max_batch_size))  # bursts: 2x
    return Tuning(
        model=spec.name,
        requests=total,
        max_queue_delay_us=delay,
        preferred_batch_sizes=preferred,
        graph_batch_sizes=graphs,
        length_buckets=chosen,
        figures=figures,
    )


def _rows_per_request(spec, histogram: Counter) -> Counter:
    rows: Counter = Counter()
    for signature, count in histogram.items():
        shape = signature[0][2] if signature else ()
        rows[shape[0] if spec.max_batch_size > 0 and shape else 1] += count
    return rows


def _gathered_rows(rows: Counter, delay_us: int, peak_rate: float, max_batch: int) -> int:
    """Rows a batch gathers at the peak: (1 + requests arriving within the delay) x rows per request (p99)."""
    requests = 1 + peak_rate * delay_us / 1e6
    gathered = int(requests * _quantile(rows, 0.99) + 0.5)  # the nearest whole number of rows
    return max(1, min(gathered, max_batch)) if max_batch > 0 else 1


def _quantile(counts: Counter, q: float) -> int:
    total, seen = sum(counts.values()), 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= q * total:
            return int(value)
    return int(max(counts)) if counts else 0


def _batch_steps(high: int) -> tuple[int, ...]:
    from tpserve.triton_models.runtime.ragged import batch_steps

    return batch_steps(max(1, high))


def _default_buckets(longest: int) -> tuple[int, ...]:
    from tpserve.triton_models.runtime.ragged import MIN_LENGTH_BUCKET, length_steps

    return length_steps(min(MIN_LENGTH_BUCKET, longest), longest)


def _lengths(spec, histogram: Counter) -> Counter:
    """Rows per recorded length of a sequence model's first dynamic input (empty for other models)."""
    dynamic = next((t for t in spec.inputs if -1 in t.dims), None)
    if dynamic is None:
        return Counter()
    axis = list(dynamic.dims).index(-1) + (1 if spec.max_batch_size > 0 else 0)
    lengths: Counter = Counter()
    for signature, count in histogram.items():
        for name, _, shape in signature:
            if name == dynamic.name and len(shape) > axis:
                lengths[int(shape[axis])] += count * (int(shape[0]) if spec.max_batch_size > 0 else 1)
    return lengths


def padding_efficiency(lengths: Counter, buckets: tuple[int, ...]) -> float:
    """Real tokens over computed tokens when each row is padded to the smallest bucket that holds it."""
    real = sum(length * n for length, n in lengths.items())
    computed = sum(_bucket(length, buckets) * n for length, n in lengths.items())
    return real / computed if computed else 1.0


def _bucket(length: int, buckets: tuple[int, ...]) -> int:
    return next((b for b in buckets if b >= length), max(buckets[-1], length))


def choose_length_buckets(lengths: Counter, longest: int, count: int = 15) -> tuple[int, ...]:
    """At most `count` buckets (multiples of 8, and `longest` always, for lengths not recorded) that pad the
    recorded lengths least: dynamic programming over the candidate edges."""
    steps: Counter = Counter()
    for length, n in lengths.items():
        steps[min(longest, max(LENGTH_STEP, math.ceil(length / LENGTH_STEP) * LENGTH_STEP))] += n
    edges = sorted(set(steps) | {longest})
    if len(edges) <= count:
        return tuple(edges)
    weight = [steps[e] for e in edges]
    # cost[k][j]: least padding with k buckets whose highest is edges[j], every length up to edges[j] covered
    best = {(1, j): (edges[j] * sum(weight[: j + 1]), -1) for j in range(len(edges))}
    for k in range(2, count + 1):
        for j in range(k - 1, len(edges)):
            best[(k, j)] = min(
                (best[(k - 1, i)][0] + edges[j] * sum(weight[i + 1 : j + 1]), i)
                for i in range(k - 2, j)
                if (k - 1, i) in best
            )
    chosen, j, k = [], len(edges) - 1, count
    while j >= 0 and k >= 1:
        chosen.append(edges[j])
        j, k = best[(k, j)][1], k - 1
    return tuple(sorted(chosen))
