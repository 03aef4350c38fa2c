"""The admission table: which models are over their queue-time budget, per replica, for the edge to refuse.

A file of the state folder (0600, made with the edge's other files): REGIONS regions, one per replica, of MODELS
entries of ENTRY bytes, each four little-endian 64-bit words: the model's name hash (FNV-1a; 0: a free entry),
until when (CLOCK_MONOTONIC, ns) the replica's supervisor marks it over budget, the edge's count of calls it
refused for it (kept in region 0's entry), and the model's last measured queue time per request (µs). The
supervisor of each replica writes its own region (supervision/admission_control.py); the edge's module reads every
region in use and refuses a model's new calls while all of them mark it (server/edge/cancel_notice.c, with the
same layout; admission_parse.h hashes the same way).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

REGIONS, MODELS, ENTRY = 128, 64, 32  # as server/edge/cancel_notice.c has them
SIZE = REGIONS * MODELS * ENTRY
FILE = "admission"


def name_hash(name: str) -> int:
    """FNV-1a over the name's bytes (0 becomes 1: 0 marks a free entry)."""
    h = 14695981039346656037
    for byte in name.encode():
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h or 1


def make_table(state_dir: Path) -> Path:
    """A fresh table of zeros in state_dir (0600); its path."""
    from tpserve.server.edge.cancel_table import fresh_file

    return fresh_file(Path(state_dir) / FILE, SIZE)


class Region:
    """One replica's region of a table, mapped: marks models over budget, reads the edge's refusal counts."""

    def __init__(self, path: Path, region: int):
        if not 0 <= region < REGIONS:
            raise ValueError(f"admission region {region}: a table has {REGIONS}")
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_size != SIZE:
                raise ValueError(f"{path} is not an admission table ({SIZE} bytes)")
            self.map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.base = region * MODELS * ENTRY
        self.slots: dict[str, int] = {}

    def _slot(self, model: str) -> int | None:
        if model in self.slots:
            return self.slots[model]
        wanted = name_hash(model)
        for i in range(MODELS):
            at = self.base + i * ENTRY
            found = struct.unpack_from("<Q", self.map, at)[0]
            if found in (0, wanted):
                if not found:
                    struct.pack_into("<Q", self.map, at, wanted)
                self.slots[model] = at
                return at
        return None  # more models than entries: the rest are never refused

    def mark(self, model: str, until_ns: int, queue_us: float) -> None:
        """The model is over budget until until_ns (0: it is not)."""
        at = self._slot(model)
        if at is not None:
            struct.pack_into("<Q", self.map, at + 8, max(0, int(until_ns)))
            struct.pack_into("<Q", self.map, at + 24, max(0, int(queue_us)))

    def refused(self, model: str) -> int:
        """Calls the edge refused for the model (counted in region 0's entries)."""
        at = self._slot(model)
        return struct.unpack_from("<Q", self.map, at + 16)[0] if at is not None else 0

    def close(self) -> None:
        self.map.close()
