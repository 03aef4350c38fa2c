"""What built an artifact: tool versions and the build host's CPU and GPU."""

from __future__ import annotations

import platform
from importlib import metadata

TOOLS = ("torch", "torchvision", "onnx", "onnxruntime", "polygraphy", "tritonclient", "nvidia-pytriton", "tensorrt")


def tool_versions() -> dict:
    """Installed versions of the tools the build uses (absent ones are left out)."""
    versions = {"python": platform.python_version()}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo, else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict | None:
    """Name and compute capability of GPU 0 as torch sees it, or None without a usable GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
        return {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}"}
    except Exception:  # a CUDA build without a driver raises several types
        return None


def host_info() -> dict:
    """The build host: CPU, core count, GPU (or None), OS."""
    import os

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "gpu": gpu_info(), "os": platform.platform()}
