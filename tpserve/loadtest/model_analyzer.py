"""NVIDIA Model Analyzer on our repositories: installed into .tools/model-analyzer (its own environment: its pins
are not ours), started in its local launch mode on the checkout's bin/tritonserver and bin/perf_analyzer
(server/triton/standalone.py), with a configuration written for the models asked (free ports, a CPU-only flag
where the host has no GPU, its checkpoint kept in the report folder so that it re-analyses without measuring).

Its remote mode cannot profile a `make serve` server: it loads each configuration through the model-control API,
which ours keeps behind the admin key (and the supervisor reloads the repository's own configs). Local mode with
the launcher is the tested way.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError
from tpserve.paths import CHECKOUT, TOOLS

HOME = TOOLS / "model-analyzer"
VERSION = "1.58.0"  # triton-model-analyzer: tried on our repositories with the launcher
LAUNCHERS = CHECKOUT / "bin"


def binary() -> Path:
    """model-analyzer of .tools/model-analyzer.

    Raises:
        MeasurementError: not installed there.
    """
    found = HOME / "bin" / "model-analyzer"
    if not found.exists():
        raise MeasurementError(
            f"Model Analyzer is not installed in {HOME}: `make install-model-analyzer` (triton-model-analyzer=="
            f"{VERSION} in an environment of its own)"
        )
    return found


def install() -> Path:
    """An environment of its own in .tools/model-analyzer holding triton-model-analyzer==VERSION (kept if there)."""
    found = HOME / "bin" / "model-analyzer"
    if found.exists():
        return found
    partial = HOME.with_name(HOME.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    step(f"model-analyzer: a Python environment in {HOME} with triton-model-analyzer=={VERSION}")
    subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
    subprocess.run(
        [str(partial / "bin" / "python"), "-m", "pip", "install", "-q", f"triton-model-analyzer=={VERSION}"],
        check=True,
    )
    partial.rename(HOME)  # console scripts name the environment's python by path: rewrite them for the new place
    for script in (HOME / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            text = script.read_bytes()
            if text.startswith(b"#!") and str(partial).encode() in text:
                script.write_bytes(text.replace(str(partial).encode(), str(HOME).encode()))
    return found


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def config(repo: Path, models: tuple[str, ...], out: Path, ports: tuple[int, int, int], search: dict) -> dict:
    """Model Analyzer's configuration (YAML as a dict): local launch on the launchers, the models (CPU-only where
    there is no GPU), its output repository, export and checkpoint folders under out; search: its
    run_config_search_* bounds (e.g. max_concurrency)."""
    cpu_only = not has_gpu()
    return {
        "model_repository": str(repo.resolve()),
        "profile_models": {m: {"cpu_only": True} if cpu_only else {} for m in models},
        "triton_launch_mode": "local",
        "triton_server_path": str(LAUNCHERS / "tritonserver"),
        "perf_analyzer_path": str(LAUNCHERS / "perf_analyzer"),
        "triton_http_endpoint": f"localhost:{ports[0]}",
        "triton_grpc_endpoint": f"localhost:{ports[1]}",
        "triton_metrics_url": f"http://localhost:{ports[2]}/metrics",
        "output_model_repository_path": str((out / "output_repository").resolve()),
        "override_output_model_repository": True,
        "export_path": str((out / "export").resolve()),
        "checkpoint_directory": str((out / "checkpoints").resolve()),
        **{f"run_config_search_{key}": value for key, value in search.items()},
    }


def profile(repo: Path, models: tuple[str, ...], out: Path, search: dict) -> Path:
    """Write the configuration and run `model-analyzer profile` (its lines shown as they come); the folder of its
    results (CSV) and reports (HTML).

    Raises:
        MeasurementError: not installed, or it failed (its log's end given).
    """
    import yaml

    from tpserve.common import endpoints

    if not models:
        raise MeasurementError("name the models to profile (--models, MODELS=)")
    found = binary()
    out.mkdir(parents=True, exist_ok=True)
    (out / "export").mkdir(exist_ok=True)
    path = out / "model_analyzer.yaml"
    http, grpc, metrics = endpoints.free_ports(3)
    path.write_text(yaml.safe_dump(config(repo, models, out, (http, grpc, metrics), search)))
    log = out / "model_analyzer.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [str(found), "profile", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            handle.write(line)
            if "Profiling" in line or "Profile complete" in line or "Exporting" in line:
                step(line.strip().removeprefix("[Model Analyzer] "))
        code = process.wait()
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-12:])
        raise MeasurementError(f"model-analyzer profile failed (exit {code}); {log} ends:\n{tail}")
    return out / "export"
