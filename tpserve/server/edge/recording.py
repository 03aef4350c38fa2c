"""Recording the traffic a server sees, at the edge (`make serve RECORD=1`, `make cluster RECORD=1`).

Envoy does the work. On HTTP the checks' module (server/edge/checks_module.c) puts what each inference request carried
into dynamic metadata, and a file access log writes one JSON line per request, in the format of common/traffic.py, to
STATE_DIR/traffic/traffic-current.jsonl. On gRPC a native module (server/edge/record_grpc.c) reads each request as
it passes and writes its line itself, to traffic-current-grpc.jsonl. Envoy's keeper (server/edge/envoy_process.py)
rotates those files past a size and removes the oldest past a count.
Values are not recorded unless asked (values=True): then each request's body, up to max_value_bytes, copied as it
passes on both protocols (nothing is held back).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tpserve.common.errors import ServerError
from tpserve.common.traffic import CURRENT, CURRENT_GRPC, CURRENTS, recording_files, rotated_name

FILE_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"
MODES = ("off", "shapes", "values")


@dataclass(frozen=True)
class RecordSettings:
    """Where a recording goes, what it keeps and how much of it stays on disk."""

    folder: Path
    values: bool = False  # each request's body (base64), up to max_value_bytes; shapes only otherwise
    max_file_mb: float = 64.0  # the current file is rotated past this
    max_files: int = 8  # rotated files kept (oldest removed first): the cap is about max_files x max_file_mb
    max_value_bytes: int = 1 << 20
    head_bytes: int = 1 << 16  # gRPC: a message's header is read from its first bytes, these many

    def __post_init__(self):
        if self.max_file_mb <= 0 or self.max_files < 1 or self.max_value_bytes < 0:
            raise ServerError(
                f"recording cap {self.max_files} files of {self.max_file_mb} MB: use at least one file of > 0 MB"
            )

    @property
    def current(self) -> Path:
        return self.folder / CURRENT

    @property
    def current_grpc(self) -> Path:
        """Where the native gRPC reader writes its lines (a file of its own: see common.traffic.CURRENTS)."""
        return self.folder / CURRENT_GRPC

    def to_args(self) -> list[str]:
        """The keeper's command-line options for this recording."""
        return [
            "--record-dir",
            str(self.folder),
            "--record-file-mb",
            str(self.max_file_mb),
            "--record-files",
            str(self.max_files),
        ]


def record_settings(mode: str, state_dir: Path, max_file_mb: float = 64.0, max_files: int = 8) -> RecordSettings | None:
    """RECORD=0/1/values (or off/shapes/values) as settings under STATE_DIR/traffic (None: off).

    Raises:
        ServerError: an unknown mode.
    """
    named = {"0": "off", "": "off", "1": "shapes", "on": "shapes"}.get(mode.strip().lower(), mode.strip().lower())
    if named not in MODES:
        raise ServerError(f"RECORD={mode!r}: use 1 (shapes, no values), values (bodies too) or 0 (off)")
    if named == "off":
        return None
    folder = Path(state_dir).absolute() / "traffic"
    return RecordSettings(folder, values=named == "values", max_file_mb=max_file_mb, max_files=max_files)


def prepare(settings: RecordSettings) -> None:
    """The recording's folder, private (0700), before Envoy opens its file (Envoy's umask makes that 0600)."""
    settings.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(settings.folder, 0o700)


def access_logs(settings: RecordSettings) -> dict:
    """Each listener's access logs while recording: HTTP's; gRPC has none, its module writes its lines (the log and
    the metadata it read cost about 30 µs of Envoy's CPU a gRPC request; docs/measuring.md)."""
    return {"http": (access_log(settings),), "grpc": ()}


def access_log(settings: RecordSettings) -> dict:
    """Envoy's file access log of the HTTP listener: a line per request that the checks module named a model for."""
    line = {
        "t": "%START_TIME(%s%6f)%",
        "protocol": "http",
        "request": "%DYNAMIC_METADATA(traffic:request)%",
        "bytes": "%BYTES_RECEIVED%",
        "status": "%RESPONSE_CODE%",
        "duration_us": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
        "values": "%DYNAMIC_METADATA(traffic:values)%",
    }
    named = {"filter": "traffic", "path": [{"key": "request"}], "value": {"present_match": True}}
    return {
        "name": "envoy.access_loggers.file",
        "filter": {"metadata_filter": {"matcher": named, "match_if_key_not_found": False}},
        "typed_config": {"@type": FILE_LOG, "path": str(settings.current), "log_format": {"json_format": line}},
    }


def grpc_filters(settings: RecordSettings, rules: dict) -> list[dict]:
    """The gRPC listener's filters while recording (rules: server.edge.model_rules): the native recorder
    (server/edge/record_grpc.c), which reads ModelInfer as its bytes pass, keeps the body where values are
    recorded, holds nothing back and writes each request's line to current_grpc."""
    from tpserve.server.edge.record_module import module_filter

    sizes = {n: r.max_batch_size for n, r in rules.items()}
    kept = settings.max_value_bytes if settings.values else None
    return [module_filter(sizes, settings.head_bytes, settings.current_grpc, kept)]


def rotate(settings: RecordSettings, reopen) -> Path | None:
    """Past max_file_mb, rename a current file to the next traffic-NNNNNN.jsonl and have its writer reopen it
    (the access log's: reopen(), POST /reopen_logs; the gRPC reader's sees the rename at its next write), then
    remove the oldest rotated files past max_files; the last path rotated to (None: none)."""
    target = None
    for current in (settings.folder / name for name in CURRENTS):
        try:
            size = current.stat().st_size
        except FileNotFoundError:
            continue
        if size < settings.max_file_mb * (1 << 20):
            continue
        target = settings.folder / rotated_name(settings.folder)
        os.replace(current, target)
        if current.name == CURRENT:
            reopen()
    if target is not None:
        rotated = [p for p in recording_files(settings.folder) if p.name not in CURRENTS]
        for old in rotated[: -settings.max_files]:
            old.unlink(missing_ok=True)
    return target
