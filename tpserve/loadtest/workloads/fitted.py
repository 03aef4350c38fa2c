"""A workload fitted from a recording: small, readable, free of data, fit to commit.

Per model it keeps the arrival process (its rate over time in bins, and how bursty arrivals are within them:
the coefficient of variation of the gaps between requests), the protocols' shares and the shape histogram.
`make loadtest WORKLOAD=<file> [SCALE=3]` turns it back into requests: in each bin, arrivals from a gamma
renewal process of the bin's rate times SCALE and the fitted variation; shapes and protocols drawn by share
(seeded), replayed open loop like a recording.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path

import numpy as np

from tpserve.common.errors import RecordingError
from tpserve.common.traffic import WORKLOAD_FORMAT, RecordedInput, RecordedRequest
from tpserve.loadtest.workloads.recorded import ReplayItem

FORMAT = WORKLOAD_FORMAT


def fit(requests: list[RecordedRequest], bin_s: float = 10.0, source: str = "") -> dict:
    """The workload of a recording (requests with inputs read; refused ones are left out).

    Raises:
        RecordingError: nothing to fit.
    """
    kept = sorted((r for r in requests if r.inputs), key=lambda r: r.arrival_us)
    if not kept:
        raise RecordingError("the recording holds no request with inputs read: nothing to fit")
    start = kept[0].arrival_us
    duration = max(bin_s, (kept[-1].arrival_us - start) / 1e6)
    bins = math.ceil(duration / bin_s)
    models = {}
    for model in sorted({r.model for r in kept}):
        mine = [r for r in kept if r.model == model]
        offsets = [(r.arrival_us - start) / 1e6 for r in mine]
        models[model] = {
            "requests": len(mine),
            "rate_per_s": _rates(offsets, bins, bin_s),
            "gap_cv": round(_gap_cv(offsets, bin_s), 3),
            "protocols": _shares(Counter(r.protocol for r in mine)),
            "shapes": _shapes(mine),
        }
    return {"format": FORMAT, "source": source, "duration_s": round(duration, 3), "bin_s": bin_s, "models": models}


def _rates(offsets: list[float], bins: int, bin_s: float) -> list[float]:
    counts = [0] * bins
    for t in offsets:
        counts[min(bins - 1, int(t // bin_s))] += 1
    return [round(c / bin_s, 3) for c in counts]


def _gap_cv(offsets: list[float], bin_s: float) -> float:
    """How bursty within a bin: the gaps' standard deviation over their mean, each gap taken relative to its
    bin's mean gap (the rate's changes from bin to bin are in the rates already). 1: Poisson; above: bursts."""
    by_bin: dict[int, list[float]] = {}
    for t in offsets:
        by_bin.setdefault(int(t // bin_s), []).append(t)
    relative = []
    for times in by_bin.values():
        gaps = [b - a for a, b in zip(times, times[1:])]
        if len(gaps) >= 2 and statistics.mean(gaps) > 0:
            relative += [g / statistics.mean(gaps) for g in gaps]
    return statistics.pstdev(relative) if len(relative) >= 2 else 1.0


def _shares(counts: Counter) -> dict:
    total = sum(counts.values())
    return {k: round(v / total, 4) for k, v in sorted(counts.items())}


def _shapes(requests: list[RecordedRequest]) -> list[dict]:
    counts = Counter(r.signature() for r in requests)
    return [
        {"inputs": [[n, d, list(s)] for n, d, s in signature], "count": count}
        for signature, count in counts.most_common()
    ]


def write_workload(workload: dict, path: Path) -> Path:
    path.write_text(json.dumps(workload, indent=1) + "\n")
    return path


def read_workload(path: Path) -> dict:
    """A workload file.

    Raises:
        RecordingError: not one (what is wrong named).
    """
    try:
        workload = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise RecordingError(
            f"{path}: not a workload file ({err}); make one with `python -m tpserve.loadtest fit-workload`"
        ) from None
    if not isinstance(workload, dict) or workload.get("format") != FORMAT or not workload.get("models"):
        raise RecordingError(f"{path}: not a workload file (expected format {FORMAT!r} with models)")
    return workload


def generate(workload: dict, scale: float = 1.0, seed: int = 0, protocol: str = "") -> list[ReplayItem]:
    """Requests of a workload, rates times scale, in time order (seeded: the same file and seed, the same run).

    Raises:
        RecordingError: scale not positive.
    """
    if not scale > 0:
        raise RecordingError(f"SCALE={scale}: a workload's scale is a positive factor (2: twice the rate)")
    rng, items, bin_s = np.random.default_rng(seed), [], float(workload["bin_s"])
    for model, fitted in sorted(workload["models"].items()):
        signatures = [tuple(RecordedInput(n, d, tuple(s)) for n, d, s in shape["inputs"]) for shape in fitted["shapes"]]
        weights = np.array([shape["count"] for shape in fitted["shapes"]], float)
        protocols = list(fitted["protocols"])
        shares = np.array([fitted["protocols"][p] for p in protocols], float)
        for index, rate in enumerate(fitted["rate_per_s"]):
            for t in _arrivals(rng, rate * scale, fitted["gap_cv"], index * bin_s, bin_s):
                shape = signatures[rng.choice(len(signatures), p=weights / weights.sum())]
                chosen = protocol or protocols[rng.choice(len(protocols), p=shares / shares.sum())]
                items.append(ReplayItem(round(t, 6), model, "", chosen, shape))
    return sorted(items, key=lambda i: i.offset_s)


def _arrivals(rng, rate: float, cv: float, start: float, length: float) -> list[float]:
    """Arrival times in [start, start + length): a gamma renewal process of the rate and gap variation."""
    if rate <= 0:
        return []
    k = 1.0 / max(cv, 0.05) ** 2  # gamma shape from the gaps' variation (k = 1: Poisson)
    times, t = [], start + rng.uniform(0, 1.0 / rate)
    while t < start + length:
        times.append(t)
        t += rng.gamma(k, 1.0 / (rate * k))
    return times
