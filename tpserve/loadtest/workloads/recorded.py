"""A recording as a replay: when to send what (common/traffic.py's requests, in arrival order, SPEED times
faster), the inputs to send, and the figures that compare a replay with its recording.

The dispatcher is open loop: each request leaves at its recorded offset whatever the earlier ones are doing.
It takes its clock, its sleep and its spawn as arguments, so a test drives it with a test clock.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpserve.common.errors import RecordingError
from tpserve.common.traffic import RecordedInput, RecordedRequest


@dataclass(frozen=True)
class ReplayItem:
    """One request of a replay: when (seconds from the start), where and what."""

    offset_s: float
    model: str
    version: str
    protocol: str
    inputs: tuple[RecordedInput, ...]
    values: dict | None = None  # the recorded body where the recording kept it

    def to_line(self) -> str:
        data = {
            "offset_s": self.offset_s,
            "model": self.model,
            "version": self.version,
            "protocol": self.protocol,
            "inputs": [[i.name, i.datatype, list(i.shape)] for i in self.inputs],
        }
        return json.dumps({**data, **({"values": self.values} if self.values else {})}, separators=(",", ":"))

    @classmethod
    def from_line(cls, line: str) -> ReplayItem:
        data = json.loads(line)
        inputs = tuple(RecordedInput(n, d, tuple(s)) for n, d, s in data["inputs"])
        return cls(data["offset_s"], data["model"], data["version"], data["protocol"], inputs, data.get("values"))


def schedule(
    requests: Iterable[RecordedRequest], speed: float = 1.0, protocol: str = "", models: tuple[str, ...] = ()
) -> tuple[list[ReplayItem], Counter]:
    """The replay of a recording: its requests in arrival order, offsets divided by speed; and what was left out
    (refused at the edge with nothing read; models not asked for), by reason.

    protocol: send everything over this one ('' keeps each request's own).

    Raises:
        RecordingError: speed not positive, or nothing to replay.
    """
    if not speed > 0:
        raise RecordingError(f"SPEED={speed}: a replay speed is a positive factor (1: as recorded, 3: three times)")
    ordered = sorted(requests, key=lambda r: r.arrival_us)
    if not ordered:
        raise RecordingError("the recording holds no requests")
    start, items = ordered[0].arrival_us, []
    left_out: Counter = Counter()
    for r in ordered:
        if models and r.model not in models:
            left_out[f"model {r.model} not asked for"] += 1
        elif not r.inputs:
            left_out[f"no inputs read (status {r.status}: refused before the server)"] += 1
        else:
            offset = (r.arrival_us - start) / 1e6 / speed
            items.append(ReplayItem(offset, r.model, r.version, protocol or r.protocol, r.inputs, r.values))
    if not items:
        raise RecordingError(f"nothing in the recording can be replayed: {dict(left_out)}")
    return items, left_out


def write_schedule(items: list[ReplayItem], path: Path) -> Path:
    path.write_text("".join(item.to_line() + "\n" for item in items))
    return path


def read_schedule(path: Path) -> list[ReplayItem]:
    return [ReplayItem.from_line(line) for line in Path(path).read_text().splitlines() if line.strip()]


def dispatch(
    items: list[ReplayItem],
    send: Callable[[ReplayItem], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    spawn: Callable[..., object],
) -> float:
    """Open loop: spawn send(item) at each item's offset from now (never early); the seconds it fell behind at
    most (how late the latest send left)."""
    start, behind = clock(), 0.0
    for item in items:
        wait = start + item.offset_s - clock()
        if wait > 0:
            sleep(wait)
        behind = max(behind, clock() - start - item.offset_s)
        spawn(send, item)
    return behind


def synthetic_inputs(item: ReplayItem, spec=None, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of exactly the recorded shapes. Values from the model's spec where it is ours (its value ranges);
    otherwise integers from [0, 2) and floats from a standard normal; IMAGE and TEXT get real payloads.

    Raises:
        RecordingError: another BYTES input (its values cannot be made up: record them with RECORD=values).
    """
    arrays = {}
    for i, recorded in enumerate(item.inputs):
        rng = np.random.default_rng(seed + i)
        if recorded.datatype == "BYTES":
            arrays[recorded.name] = _bytes_values(item.model, recorded)
            continue
        if _numpy_dtype(recorded.datatype) is None:
            raise RecordingError(
                f"{item.model}: input {recorded.name} has datatype {recorded.datatype}, not replayable"
            )
        arrays[recorded.name] = _numeric(rng, recorded, spec)
    return arrays


def _bytes_values(model: str, recorded: RecordedInput) -> np.ndarray:
    from tpserve.clients.inputs import bytes_payload

    if recorded.name not in ("IMAGE", "TEXT"):
        raise RecordingError(
            f"{model}: BYTES input {recorded.name} cannot be made up; record its values (RECORD=values) to replay it"
        )
    payload = bytes_payload(recorded.name, 1)[0, 0]
    values = np.empty(recorded.shape, dtype=object)
    values.fill(payload)
    return values


def _numeric(rng, recorded: RecordedInput, spec) -> np.ndarray:
    ours = next((t for t in (spec.inputs if spec else ()) if t.name == recorded.name), None)
    if ours is not None and ours.dtype == recorded.datatype:
        from tpserve.builders.formats.export import random_values

        return random_values(rng, ours, recorded.shape)
    from tpserve.clients.inputs import made_up_values

    return made_up_values(rng, _numpy_dtype(recorded.datatype), recorded.shape)


def _numpy_dtype(datatype: str):
    """The numpy dtype of a numeric Triton datatype that tritonclient can send (None for BYTES and unknown ones)."""
    from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

    dtype = triton_to_np_dtype(datatype)
    if dtype is None or dtype is np.object_ or np_to_triton_dtype(np.dtype(dtype)) != datatype:
        return None
    return dtype


def per_second(offsets_s: Iterable[float], seconds: int | None = None) -> list[int]:
    """How many requests fell in each whole second from 0."""
    offsets = list(offsets_s)
    length = seconds if seconds is not None else (int(max(offsets)) + 1 if offsets else 0)
    counts = [0] * length
    for offset in offsets:
        if 0 <= offset < length:
            counts[int(offset)] += 1
    return counts


def correlation(a: list[int], b: list[int]) -> float:
    """Pearson's r of two equally long series (nan where either is constant)."""
    n = min(len(a), len(b))
    if n < 2:
        return math.nan
    x, y = np.asarray(a[:n], float), np.asarray(b[:n], float)
    if x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])
