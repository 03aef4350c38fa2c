"""Refuse to serve TensorRT plans and compiled engines on a server or GPU they were not built for.

The #1 complaint about TensorRT deployments is a plan built by one TensorRT version (or on
one GPU architecture) and loaded by another. manifest.json records, per plan, the TensorRT
and CUDA versions, GPU name and compute capability; before serving, these are compared with
the target: the server image's TensorRT and the GPU present. Compiled engines (torch.compile,
builders.formats.torch_compiled) are held to the same rule with torch and triton-lang in TensorRT's place.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from tpserve.common.errors import ToolError

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


class GuardError(ToolError):
    """A plan does not fit the server or GPU it would be served on."""


@dataclass(frozen=True)
class Target:
    """What a plan would run on: TensorRT version (None: no TensorRT) and GPU."""

    tensorrt: str | None
    compute_capability: str | None
    gpu: str | None
    where: str
    torch: str | None = None
    triton: str | None = None


def _version(text: str) -> tuple[int, int, int]:
    match = _VERSION.search(text or "")
    if not match:
        return (0, 0, 0)
    major, minor, patch = (int(g) for g in match.groups())
    return (major, minor, patch)


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = (text or "0.0").partition(".")
    return int(major), int(minor or 0)


def engine_problems(model: str, engine: dict, target: Target) -> list[str]:
    """What keeps one plan from running on the target (empty: it fits)."""
    built, found = engine["tensorrt"], target.tensorrt
    rebuild = f"rebuild {model} with `make build-engines-docker` against the server's NGC release"
    if found is None:
        return [
            f"{model}: {target.where} has no TensorRT; serve plans with the NGC tritonserver image "
            "(`make serve-docker`), or serve the ONNX variant on the embedded server"
        ]
    problems = []
    if engine.get("version_compatible"):
        if _version(found)[0] != _version(built)[0] or _version(found) < _version(built):
            problems.append(
                f"{model}: version-compatible plan built with TensorRT {built} needs TensorRT "
                f"{_version(built)[0]}.x >= {built}, {target.where} has {found}; {rebuild}"
            )
    elif _version(found) != _version(built):
        problems.append(f"{model}: plan built with TensorRT {built}, {target.where} has TensorRT {found}; {rebuild}")
    problems += _hardware_problems(model, engine, target)
    return problems


def _hardware_problems(model: str, engine: dict, target: Target) -> list[str]:
    built, found = engine["compute_capability"], target.compute_capability
    if found is None:
        return [f"{model}: no GPU found on {target.where}; TensorRT plans need one"]
    if engine.get("hardware_compatible"):
        if _cc(found) < (8, 0):
            return [f"{model}: hardware-compatible (Ampere+) plan, but {target.gpu} is compute capability {found}"]
        return []
    if _cc(found) != _cc(built):
        return [
            f"{model}: plan built for compute capability {built} ({engine.get('gpu')}), {target.where} has "
            f"{target.gpu} ({found}); rebuild on that GPU (per-architecture plans add to cc_model_filenames) "
            "or build with --hardware-compatible"
        ]
    return []


def compiled_problems(model: str, compiled: dict, target: Target) -> list[str]:
    """What keeps a compiled engine from running on the target (empty: it fits)."""
    rebuild = f"rebuild {model} on the server host (make build-engines there: engines are compiled for it)"
    if target.torch is None:
        return [f"{model}: {target.where} has no torch; a compiled engine runs in the torch runtime"]
    problems = []
    if compiled["torch"] != target.torch:
        problems.append(
            f"{model}: compiled with torch {compiled['torch']}, {target.where} has torch {target.torch}; {rebuild}"
        )
    if compiled.get("device") != "cuda":
        return problems
    if compiled.get("triton") != target.triton:
        problems.append(
            f"{model}: kernels compiled with triton {compiled.get('triton')}, {target.where} has triton "
            f"{target.triton}; {rebuild}"
        )
    if target.compute_capability is None:
        problems.append(
            f"{model}: compiled for a GPU ({(compiled.get('gpu') or {}).get('name')}), {target.where} "
            "has none; serve the ONNX or an eager torch variant there"
        )
    elif _cc(target.compute_capability) != _cc(compiled["compute_capability"]):
        problems.append(
            f"{model}: compiled for compute capability {compiled['compute_capability']} "
            f"({(compiled.get('gpu') or {}).get('name')}), {target.where} has {target.gpu} "
            f"({target.compute_capability}); {rebuild}"
        )
    return problems


def model_problems(name: str, entry: dict, target: Target) -> list[str]:
    """Problems of one manifest entry: fine if any of its per-architecture plans fits."""
    if entry.get("compiled"):
        return compiled_problems(name, entry["compiled"], target)
    engines = entry.get("engines") or {}
    if not engines:
        return []
    per_engine = [engine_problems(name, engine, target) for engine in engines.values()]
    return [] if any(not p for p in per_engine) else min(per_engine, key=len)


def check_manifest(manifest: dict, target: Target) -> None:
    """Raise GuardError listing every plan that does not fit the target."""
    problems = [
        p for name, entry in sorted(manifest.get("models", {}).items()) for p in model_problems(name, entry, target)
    ]
    if problems:
        raise GuardError("refusing to serve plans that do not fit:\n  " + "\n  ".join(problems))


def local_target(tensorrt: bool = True, where: str = "this host") -> Target:
    """This host: the tensorrt module's version (if any and asked), torch, triton and GPU 0 from nvidia-smi."""
    version = None
    if tensorrt:
        try:
            import tensorrt as trt

            version = trt.__version__
        except ImportError:
            pass
    gpu, cc = _nvidia_smi(["nvidia-smi"])
    return Target(version, cc, gpu, where, _installed("torch"), _installed("triton"))


def _installed(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def image_target(image: str) -> Target:
    """A server image: its libnvinfer version, and the GPU as the container sees it."""
    script = "ls /usr/lib/x86_64-linux-gnu/libnvinfer.so.* 2>/dev/null | head -n 1"
    done = _run(["docker", "run", "--rm", "--entrypoint", "sh", image, "-c", script])
    version = _VERSION.search(done)
    gpu, cc = _nvidia_smi(["docker", "run", "--rm", "--gpus", "all", "--entrypoint", "nvidia-smi", image])
    return Target(".".join(version.groups()) if version else None, cc, gpu, f"image {image}")


def _nvidia_smi(prefix: list[str]) -> tuple[str | None, str | None]:
    out = _run([*prefix, "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    if "," not in out:
        return None, None
    name, cc = out.splitlines()[0].rsplit(",", 1)
    return name.strip(), cc.strip()


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
