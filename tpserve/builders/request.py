"""A build request: which model spec, for which serving target, written where, checked how."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpserve.builders.repository.writer import ServingOptions
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """What to build, where, and how to serve it."""

    spec: ModelSpec
    target: str
    repo: Path
    work_dir: Path
    options: ServingOptions = ServingOptions()
    force: bool = False
    precisions: tuple[str, ...] = ("fp32",)
    calibration: Path | None = None
    eval_data: Path | None = None  # .npz: one array per input and "labels", for the INT8 accuracy gate

    def __post_init__(self):
        unknown = [p for p in self.precisions if p not in ("fp32", "int8")]
        if unknown or "fp32" not in self.precisions:
            raise SpecError(
                f"precisions {list(self.precisions)}: the ONNX path builds 'fp32' (always) and 'int8'; "
                "fp16 needs TensorRT (the ngc target inside the NGC container: make build-engines-docker)"
            )
