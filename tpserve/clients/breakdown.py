"""Per-step latency breakdown of a model or ensemble, from Triton's statistics API."""

from __future__ import annotations

from tpserve.clients.admin import inference_statistics
from tpserve.clients.connection import as_dict, refused_as_client_error
from tpserve.common.endpoints import Endpoint

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def ensemble_steps(client, model: str) -> list[str]:
    """The composing models of an ensemble, in order (empty for a plain model)."""
    with refused_as_client_error(model):
        config = client.get_model_config(model)
    config = config if isinstance(config, dict) else as_dict(config)["config"]
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return [step["model_name"] for step in steps]


def _row(name: str, stats: dict) -> dict:
    inference = stats.get("inference_stats", {})
    success = int(inference.get("success", {}).get("count", 0))
    row: dict = {
        "model": name,
        "requests": success,
        "executions": int(stats.get("execution_count", 0)),
        "inferences": int(stats.get("inference_count", 0)),
    }
    for phase in PHASES:
        total_ns = int(inference.get(phase, {}).get("ns", 0))
        row[f"{phase}_us"] = total_ns / success / 1000 if success else 0.0
    row["avg_batch"] = row["inferences"] / row["executions"] if row["executions"] else 0.0
    return row


def breakdown(ep: Endpoint, model: str) -> list[dict]:
    """Average µs per request in queue / compute input / infer / output, per step, then the whole."""
    with ep.client() as client:
        names = ensemble_steps(client, model) + [model]
        return [_row(name, inference_statistics(ep, client, name)[0]) for name in names]


def markdown(rows: list[dict]) -> str:
    """The breakdown as a markdown table."""
    lines = ["| step | requests | avg batch | queue µs | input µs | infer µs | output µs |", "|" + "---|" * 7]
    for r in rows:
        phases = " | ".join(f"{r[f'{p}_us']:.0f}" for p in PHASES)
        lines.append(f"| {r['model']} | {r['requests']} | {r['avg_batch']:.2f} | {phases} |")
    return "\n".join(lines)
