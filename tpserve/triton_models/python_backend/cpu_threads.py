"""How many threads a CPU model instance takes: the host's cores shared among the model's instances."""

from __future__ import annotations

import os


def intra_op_threads(asked: str | int, config: dict, cores: int | None = None) -> int:
    """ONNX Runtime's intra-op threads for one instance of a model (config: its config as JSON).

    A positive parameter is taken as it is. 0 shares the cores this process may run on among the model's instances,
    at least one each; for a model of one instance it stays 0, ONNX Runtime's own default (a thread a physical core).
    Two instances that each took every core would contend for them.
    """
    if int(asked) > 0:
        return int(asked)
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    if instances == 1:
        return 0
    return max(1, (cores or len(os.sched_getaffinity(0))) // instances)
