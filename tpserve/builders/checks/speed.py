"""In-process throughput of ONNX models on the CPU, measured side by side (a benchmark, not a test)."""

from __future__ import annotations

import time
from pathlib import Path


def ort_throughput(path: Path, feed: dict, seconds: float = 2.0) -> float:
    """Samples per second of ONNX Runtime (CPU, default threads) on one batch (inputs by name), after a warmup."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session.run(None, feed)
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        session.run(None, feed)
        runs += 1
    return runs * len(next(iter(feed.values()))) / (time.perf_counter() - start)


def side_by_side(paths: dict, feed: dict, rounds: int = 3) -> dict:
    """Throughput per named model, interleaved over rounds so drift hits all alike; best round kept."""
    best = {name: 0.0 for name in paths}
    for _ in range(rounds):
        for name, path in paths.items():
            best[name] = max(best[name], ort_throughput(path, feed, seconds=1.0))
    return {name: round(value, 1) for name, value in best.items()}
