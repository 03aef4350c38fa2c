"""Per-instance activity of Python-backend models: each instance is its own stub process.

Triton 2.51's statistics API counts per model, not per instance; the stub processes carry
the instance name (e.g. digits_cnn_0_1) in their command line, so their CPU time shows
which instances executed.
"""

from __future__ import annotations

import os
from pathlib import Path

STUB = b"triton_python_backend_stub"


def instance_cpu_seconds(model: str) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each stub process of `model`'s instances."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if args and args[0].endswith(STUB):
            name = next((a.decode() for a in args if a.decode().startswith(f"{model}_") and a[-1:].isdigit()), None)
            if name and name[len(model) + 1 :].replace("_", "").isdigit():
                found[name] = (int(stat[11]) + int(stat[12])) / ticks
    return found
