"""A traffic recording: what a server saw, one JSON line per request, in rotated files under STATE_DIR/traffic/.

Each line is a RecordedRequest: when the request arrived (µs), which model and version, the protocol, each
input's name, datatype and shape, the batch, the bytes, the status and the server's duration. Values are kept
only where a recording asks for them (the request's body, base64, and for HTTP the length of its JSON
header). The edge writes model, version, inputs and batch as one JSON text under "request" (one
metadata key a request is cheaper for Envoy than four); lines with them as keys of their own read the same.
Status is the HTTP status (http) or the gRPC status code (grpc, 0: OK), -1 where none was sent.
Whatever captures the traffic (the edge, Triton's trace API) writes
through RecordingWriter; replay and workload fitting read through read_recording. The folder is private
(0700), each file 0600, and the total is capped: the oldest file goes first.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from tpserve.common.errors import RecordingError

PROTOCOLS = ("http", "grpc")
PREFIX, SUFFIX = "traffic-", ".jsonl"
CURRENT = "traffic-current.jsonl"  # the file a live recording appends to (the edge's access log)
CURRENT_GRPC = "traffic-current-grpc.jsonl"  # gRPC's lines, where the edge's native reader writes them itself
CURRENTS = (CURRENT, CURRENT_GRPC)  # two writers, two files: Envoy may write one line in several pieces
REPLAY_HEADER = "x-traffic-replay"  # `make replay` sends it; a recording marks such requests "replayed"


@dataclass(frozen=True)
class RecordedInput:
    """One input of a recorded request."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not self.name or any(d < 0 for d in self.shape):
            raise ValueError(f"input {self.name!r}: a name and a shape of non-negative dims, got {list(self.shape)}")


@dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """One request as the server saw it."""

    arrival_us: int
    model: str
    protocol: str
    inputs: tuple[RecordedInput, ...]
    version: str = ""
    batch: int = 1
    bytes: int = 0
    status: int = 200
    duration_us: int = 0
    values: dict | None = field(default=None, compare=False)  # {"body": base64, "header_length": n}, where asked
    replayed: bool = False  # sent by a replay (it carried REPLAY_HEADER), not by the traffic itself

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol {self.protocol!r}: expected one of {PROTOCOLS}")
        if not self.model:
            raise ValueError("a recorded request names its model")
        if min(self.arrival_us, self.batch, self.bytes, self.duration_us) < 0:
            raise ValueError("arrival, batch, bytes and duration are non-negative")
        object.__setattr__(
            self, "inputs", tuple(i if isinstance(i, RecordedInput) else RecordedInput(**i) for i in self.inputs)
        )

    def signature(self) -> tuple:
        """What the shape histogram counts: each input's name, datatype and shape."""
        return tuple((i.name, i.datatype, i.shape) for i in self.inputs)

    def to_line(self) -> str:
        data = {
            "t": self.arrival_us,
            "model": self.model,
            "version": self.version,
            "protocol": self.protocol,
            "inputs": [[i.name, i.datatype, list(i.shape)] for i in self.inputs],
            "batch": self.batch,
            "bytes": self.bytes,
            "status": self.status,
            "duration_us": self.duration_us,
        }
        if self.values is not None:
            data["values"] = self.values
        if self.replayed:
            data["replayed"] = True
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_line(cls, line: str) -> "RecordedRequest":
        data = json.loads(line)  # the edge's access log writes null where it has no value
        if isinstance(data.get("request"), str):  # the edge's line: model, version, inputs, batch as JSON text
            data = {**json.loads(data["request"]), **{k: v for k, v in data.items() if k != "request"}}
        inputs = tuple(RecordedInput(n, d, tuple(shape)) for n, d, shape in data.get("inputs") or ())
        return cls(
            arrival_us=int(data["t"]),
            model=data["model"],
            protocol=data["protocol"],
            inputs=inputs,
            version=str(data.get("version") or ""),
            batch=int(_given(data, "batch", 1)),
            bytes=int(_given(data, "bytes", 0)),
            status=int(_given(data, "status", -1)),
            duration_us=int(_given(data, "duration_us", 0)),
            values=_values(data.get("values")),
            replayed=data.get("replayed") is True,
        )


def _values(found) -> dict | None:
    """A line's values: {"body": base64, "header_length": n}, as an object (the gRPC recorder's own line) or as
    its JSON text (the edge's HTTP checks module, through the access log)."""
    return json.loads(found) if isinstance(found, str) else found


def _given(data: dict, key: str, default):
    value = data.get(key)
    return default if value is None else value


class RecordingWriter:
    """Appends requests to traffic-NNNNNN.jsonl files in folder, a new file past max_file_bytes, the oldest
    removed so that at most max_files remain (a size cap of about max_files x max_file_bytes)."""

    def __init__(self, folder: Path, max_file_bytes: int = 64 << 20, max_files: int = 8):
        if max_file_bytes < 1024 or max_files < 1:
            raise RecordingError(f"recording cap {max_files} files of {max_file_bytes} bytes: use >= 1 of >= 1 KiB")
        self.folder, self.max_file_bytes, self.max_files = Path(folder), max_file_bytes, max_files
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        self.index = _last_index(self.folder)
        self.handle: BinaryIO | None = None
        self.size = 0
        self._next_file()

    def write(self, request: RecordedRequest) -> None:
        line = (request.to_line() + "\n").encode()
        if self.size and self.size + len(line) > self.max_file_bytes:
            self._next_file()
        assert self.handle is not None  # opened by _next_file
        self.handle.write(line)
        self.size += len(line)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _next_file(self) -> None:
        self.close()
        self.index += 1
        path = self.folder / f"{PREFIX}{self.index:06d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        self.handle, self.size = os.fdopen(fd, "ab", buffering=1 << 16), os.fstat(fd).st_size
        for old in _rotated(self.folder)[: -self.max_files]:
            old.unlink(missing_ok=True)


def _rotated(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).glob(f"{PREFIX}*{SUFFIX}") if p.name[len(PREFIX) : -len(SUFFIX)].isdigit())


def _last_index(folder: Path) -> int:
    rotated = _rotated(folder)
    return int(rotated[-1].name[len(PREFIX) : -len(SUFFIX)]) if rotated else 0


def rotated_name(folder: Path) -> str:
    """The name of the next rotated file in folder."""
    return f"{PREFIX}{_last_index(folder) + 1:06d}{SUFFIX}"


def recording_files(folder: Path) -> list[Path]:
    """The recording's files, oldest first: the rotated ones, then those being written."""
    return _rotated(folder) + [Path(folder) / name for name in CURRENTS if (Path(folder) / name).exists()]


def read_recording(folder: Path, replayed: bool = False) -> Iterator[RecordedRequest]:
    """Every recorded request of a recording's folder (or of one of its files), in the order written (the edge
    writes a line when its request ends: sort by arrival where order matters). Requests a replay sent are left
    out (replayed=True: they are read too): a replay into a server that records is not its traffic.

    Raises:
        RecordingError: no recording there, a line that is not a recorded request (file and line named), or
            nothing but a replay's requests where those are left out.
    """
    if Path(folder).is_file() and Path(folder).suffix == ".json":
        raise RecordingError(f"{folder} is a workload file, not a recording (a folder or a .jsonl file of one)")
    files = [Path(folder)] if Path(folder).is_file() else recording_files(folder)
    if not files:
        raise RecordingError(
            f"no recording in {folder}: expected traffic-*.jsonl files (STATE_DIR/traffic after `make serve RECORD=1`)"
        )
    kept = skipped = 0
    for path in files:
        with open(path) as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    request = RecordedRequest.from_line(line)
                except (ValueError, KeyError, TypeError) as err:
                    raise RecordingError(f"{path}:{number}: not a recorded request ({err})") from None
                if request.replayed and not replayed:
                    skipped += 1
                    continue
                kept += 1
                yield request
    if skipped and not kept:
        raise RecordingError(
            f"every request in {folder} ({skipped}) was sent by a replay (marked replayed): it records a replay, "
            "not the traffic; use the recording that was replayed"
        )


def shape_histogram(requests) -> dict[str, Counter]:
    """Per model, how many requests carried each input signature (names, datatypes, shapes)."""
    found: dict[str, Counter] = {}
    for request in requests:
        found.setdefault(request.model, Counter())[request.signature()] += 1
    return found


WORKLOAD_FORMAT = "triton-workload/1"  # a workload fitted from a recording (loadtest/workloads/fitted.py)


@dataclass(frozen=True)
class TrafficShapes:
    """What a recording or a workload says about each model's requests: the shape histogram and the rate."""

    histogram: dict[str, Counter]  # model -> input signature -> requests
    peak_rate: dict[str, float]  # model -> requests/s in its busiest 10 s

    def for_model(self, name: str) -> tuple[Counter, float]:
        """A model's histogram and peak rate, its served variants' (name_*) merged in."""
        merged: Counter = Counter()
        rate = 0.0
        for model, counts in self.histogram.items():
            if model == name or model.startswith(name + "_"):
                merged.update(counts)
                rate += self.peak_rate.get(model, 0.0)
        return merged, rate


def traffic_shapes(path: Path, bin_s: float = 10.0) -> TrafficShapes:
    """The shapes of a recording (its folder or a file of it) or of a workload file.

    Raises:
        RecordingError: neither, or nothing in it.
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        return _workload_shapes(path)
    requests = [r for r in read_recording(path) if r.inputs]
    if not requests:
        raise RecordingError(f"{path}: no request with inputs read: nothing to tune from")
    start, end = min(r.arrival_us for r in requests), max(r.arrival_us for r in requests)
    bins: dict[str, Counter] = {}
    for r in requests:
        bins.setdefault(r.model, Counter())[int((r.arrival_us - start) / 1e6 // bin_s)] += 1
    covered = lambda b: max(1.0, min(bin_s, (end - start) / 1e6 - b * bin_s))  # noqa: E731  (the last bin's part)
    peak = {model: max(n / covered(b) for b, n in counts.items()) for model, counts in bins.items()}
    return TrafficShapes(shape_histogram(requests), peak)


def _workload_shapes(path: Path) -> TrafficShapes:
    try:
        workload = json.loads(path.read_text())
        histogram = {
            model: Counter(
                {tuple((n, d, tuple(s)) for n, d, s in shape["inputs"]): shape["count"] for shape in fitted["shapes"]}
            )
            for model, fitted in workload["models"].items()
        }
        peak = {model: max(fitted["rate_per_s"] or [0.0]) for model, fitted in workload["models"].items()}
    except (ValueError, KeyError, TypeError) as err:
        raise RecordingError(f"{path}: not a workload file ({err}); expected format {WORKLOAD_FORMAT!r}") from None
    return TrafficShapes(histogram, peak)
