"""TensorRT optimization profiles from a spec, and the config rules they impose (no TensorRT needed)."""

from __future__ import annotations

from dataclasses import dataclass

from tpserve.builders.repository.model_config import ModelConfig
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import ConfigError

ENGINE_PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """How to build one plan.

    Args:
        precision: fp32, fp16, or int8 (from a QDQ model; fp16 is enabled beside it).
        max_batch: the profile's max batch (default: the spec's max_batch_size).
        opt_batch: the batch TensorRT tunes for (default: half the max, at least 1).
        static_batch: build a static-shape engine for this one batch size instead of a profile.
        seq_len: (min, opt, max) for dynamic non-batch axes (text models).
        optimization_level: TensorRT builder optimization level, 0..5.
        workspace_mib: workspace memory-pool limit.
        hardware_compatible: build an Ampere+ hardware-compatible engine.
        version_compatible: build a version-compatible engine (lean runtime).
    """

    precision: str = "fp16"
    max_batch: int | None = None
    opt_batch: int | None = None
    static_batch: int | None = None
    seq_len: tuple[int, int, int] = (1, 128, 512)
    optimization_level: int = 3
    workspace_mib: int = 4096
    hardware_compatible: bool = False
    version_compatible: bool = False

    def __post_init__(self):
        if self.precision not in ENGINE_PRECISIONS:
            raise ConfigError(f"engine precision {self.precision!r} unknown; expected one of {ENGINE_PRECISIONS}")
        if not 0 <= self.optimization_level <= 5:
            raise ConfigError(f"builder optimization level {self.optimization_level} must be within 0..5")
        low, opt, high = self.seq_len
        if not 1 <= low <= opt <= high:
            raise ConfigError(f"seq_len {list(self.seq_len)} must satisfy 1 <= min <= opt <= max")


def batch_range(spec: ModelSpec, options: EngineOptions) -> tuple[int, int, int]:
    """(min, opt, max) batch of the profile; a static engine has min == opt == max."""
    if options.static_batch:
        return (options.static_batch,) * 3
    high = options.max_batch or spec.max_batch_size
    opt = options.opt_batch or max(1, high // 2)
    if not 1 <= opt <= high:
        raise ConfigError(f"opt batch {opt} must be within 1..max batch {high}")
    return 1, opt, high


def profile_shapes(spec: ModelSpec, options: EngineOptions) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Per input, the (min, opt, max) shapes of the optimization profile (three shapes each)."""
    batches = batch_range(spec, options)
    shapes: dict[str, tuple[tuple[int, ...], ...]] = {}
    for tensor in spec.inputs:
        triple = []
        for i, batch in enumerate(batches):
            dims = tuple(options.seq_len[i] if d == -1 else d for d in tensor.dims)
            triple.append((batch, *dims))
        shapes[tensor.name] = tuple(triple)
    return shapes


def length_profiles(spec: ModelSpec, options: EngineOptions) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Sequence models: one optimization profile per length bucket of the served engine's grid
    (triton_models/runtime/ragged.py), so each length band gets kernels tuned for it, as the CUDA graphs do: lengths
    (previous bucket, bucket], batches 1 .. the rows the token budget allows there (opt: half of that).
    Other models: the single profile of profile_shapes."""
    from tpserve.builders.repository.writer import ragged_inputs
    from tpserve.triton_models.runtime import ragged

    if not ragged_inputs(spec) or options.static_batch:
        return [profile_shapes(spec, options)]
    high = options.max_batch or spec.max_batch_size
    grid = ragged.default_grid(options.seq_len[2], high)
    profiles: list[dict[str, tuple[tuple[int, ...], ...]]] = []
    shortest = options.seq_len[0]
    for length in grid.lengths:
        rows = min(grid.rows_for(length), high)
        triple = ((1, shortest), (max(1, rows // 2), length), (rows, length))
        profiles.append({t.name: triple for t in spec.inputs})
        shortest = length + 1
    return profiles


def check_config_against_profile(config: ModelConfig, batches: tuple[int, int, int]) -> None:
    """A plan's config must stay inside its profile: raise ConfigError saying how to fix it."""
    low, _, high = batches
    if config.max_batch_size > high:
        raise ConfigError(
            f"{config.name}: engine max batch {high} < max_batch_size {config.max_batch_size}: rebuild with "
            f"--max-batch {config.max_batch_size} or lower max_batch_size to {high}"
        )
    batching = config.dynamic_batching
    outside = [b for b in (batching.preferred_batch_size if batching else ()) if not low <= b <= high]
    if outside:
        raise ConfigError(
            f"{config.name}: preferred batch sizes {outside} lie outside the engine profile {low}..{high}: "
            f"choose preferred sizes within {low}..{high} or rebuild the engine with a wider profile"
        )


def plan_filename(compute_capability: str) -> str:
    """File name of the plan for one compute capability, e.g. model_sm90.plan for 9.0."""
    return f"model_sm{compute_capability.replace('.', '')}.plan"


def cc_model_filenames(existing: dict, compute_capability: str) -> dict:
    """cc_model_filenames with this compute capability's plan added (per-architecture engines)."""
    return {**existing, compute_capability: plan_filename(compute_capability)}
