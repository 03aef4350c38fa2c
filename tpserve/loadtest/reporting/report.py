"""Reports people read: report.md and report.html per run folder, with plots and history.

A run folder (reports/<timestamp>/) holds what the measurement commands wrote: perf.csv
(perf_analyzer), locust_stats.csv (Locust), breakdown.json (per-step latency of ensembles),
environment.json. The report adds plots (throughput vs p99 per variant, latency breakdown per
ensemble step, accuracy vs speed per precision), the CPU vs GPU vs TensorRT table (with the reason for a
missing row, or the row of another run beside it), the environment, and the change against an earlier run
that measured the same points.
"""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Sequence
from pathlib import Path

from tpserve.common.cli import step
from tpserve.loadtest.reporting.perf_rows import read_csv as read_perf
from tpserve.loadtest.reporting.plots import pyplot, save, throughput_vs_latency

Table = tuple[list[str], list[list[str]]]


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV file (empty if it does not exist)."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _num(row: dict, key: str) -> float:
    return float(row[key])


def best_per_model(perf_rows: list[dict]) -> dict[str, dict]:
    """Per model: the perf row with the highest throughput."""
    best: dict[str, dict] = {}
    for row in perf_rows:
        if row["model"] not in best or _num(row, "throughput") > _num(best[row["model"]], "throughput"):
            best[row["model"]] = row
    return best


def runtime_class(entry: dict | None) -> str:
    """CPU, GPU or TensorRT, from a manifest entry."""
    if entry is None:
        return "unknown"
    if entry.get("backend") == "tensorrt_plan":
        return "TensorRT"
    return "GPU" if entry.get("kind") == "KIND_GPU" else "CPU"


CLASSES = ("CPU", "GPU", "TensorRT")


def runtime_table(perf_rows: list[dict], manifest: dict, environment: dict, others: Sequence[Path] = ()) -> Table:
    """CPU vs GPU vs TensorRT rows (best measured variant of each). A class this run did not measure is
    taken from the latest other run folder that did (named in the row), or its row says why it is missing."""
    by_class = _best_by_class(perf_rows, manifest)
    rows = []
    for cls in (*CLASSES, "unknown"):
        for row in by_class.get(cls, []):
            rows.append(_runtime_row(cls, row, "" if cls != "unknown" else "not in the repository's manifest"))
        if cls in by_class or cls == "unknown":
            continue
        found = _from_other_run(cls, manifest, others)
        rows += [_runtime_row(cls, row, f"not in this run: from {folder}") for folder, row in found] or [
            [cls, "—", "—", "—", "—", _missing(cls, perf_rows, environment)]
        ]
    return ["runtime", "model", "p50 ms", "best infer/s", "at", "why missing / source"], rows


def _best_by_class(perf_rows: list[dict], manifest: dict) -> dict[str, list[dict]]:
    by_class: dict[str, list[dict]] = {}
    for model, row in best_per_model(perf_rows).items():
        by_class.setdefault(runtime_class(manifest.get(model)), []).append(row)
    return by_class


def _runtime_row(cls: str, row: dict, note: str) -> list[str]:
    return [
        cls,
        row["model"],
        f"{_num(row, 'p50_ms'):.2f}",
        f"{_num(row, 'throughput'):.1f}",
        f"b{row['batch']} {_point(row)}",
        note,
    ]


def _from_other_run(cls: str, manifest: dict, others: Sequence[Path]) -> list[tuple[str, dict]]:
    for folder in sorted(others, reverse=True):
        rows = _best_by_class(read_perf(folder / "perf.csv"), manifest).get(cls, [])
        if rows:
            return [(folder.name, r) for r in rows]
    return []


def _missing(cls: str, perf_rows: list[dict], environment: dict) -> str:
    if cls == "TensorRT":
        return "no TensorRT plan measured (TensorRT builds in the NGC container: make build-engines-docker)"
    if cls == "GPU" and not environment.get("host", {}).get("gpu"):
        return "no CUDA GPU on this host"
    if not perf_rows:
        return f"no perf_analyzer points in this run or an earlier one beside it (make perf measures a {cls} variant)"
    return f"no {cls} variant measured here or in an earlier run beside it"


def perf_table(perf_rows: list[dict]) -> Table:
    """Every perf_analyzer point."""
    from tpserve.loadtest.reporting.perf_rows import stability

    head = ["model", "proto", "batch", "load", "infer/s", "p50 ms", "p99 ms", "queue µs", "infer µs", "stability"]
    rows = [
        [
            r["model"],
            r["protocol"],
            r["batch"],
            _point(r),
            f"{_num(r, 'throughput'):.1f}",
            f"{_num(r, 'p50_ms'):.2f}",
            f"{_num(r, 'p99_ms'):.2f}",
            f"{_num(r, 'queue_us'):.0f}",
            f"{_num(r, 'compute_infer_us'):.0f}",
            stability(r),
        ]
        for r in perf_rows
    ]
    return head, rows


def _point(row: dict) -> str:
    return f"{row['load']} {float(row['level']):g}"


def _change(new: dict, old: dict, key: str) -> str:
    before = _num(old, key)
    return f"{100 * (_num(new, key) / before - 1):+.1f}%" if before else "n/a"


def _key(row: dict) -> tuple:
    return row["model"], row["protocol"], row["batch"], row["load"], float(row["level"])


def comparable_run(run: Path, candidates: list[Path]) -> Path | None:
    """The latest of candidates (earlier run folders) that measured at least one of run's points
    (same model, protocol, batch and load): only like is compared with like."""
    mine = {_key(r) for r in read_perf(run / "perf.csv")}
    for folder in sorted(candidates, reverse=True):
        if mine & {_key(r) for r in read_perf(folder / "perf.csv")}:
            return folder
    return None


def history_table(current: list[dict], earlier: list[dict]) -> Table:
    """Change of throughput and p99 per matching point against an earlier run."""
    before = {_key(r): r for r in earlier}
    rows = []
    for row in current:
        old = before.get(_key(row))
        if old is None:
            continue
        tput = f"{_num(old, 'throughput'):.1f} → {_num(row, 'throughput'):.1f}"
        p99 = f"{_num(old, 'p99_ms'):.2f} → {_num(row, 'p99_ms'):.2f}"
        point = f"b{row['batch']} {_point(row)}"
        rows.append([row["model"], point, tput, _change(row, old, "throughput"), p99, _change(row, old, "p99_ms")])
    return ["model", "point", "infer/s", "Δ infer/s", "p99 ms", "Δ p99"], rows


def locust_table(rows: list[dict]) -> Table:
    """Locust's per-request stats."""
    head = ["request", "type", "requests", "failures", "req/s", "p50 ms", "p99 ms"]
    return head, [
        [
            r["Name"],
            r["Type"],
            r["Request Count"],
            r["Failure Count"],
            f"{float(r['Requests/s']):.1f}",
            r["50%"],
            r["99%"],
        ]
        for r in rows
        if r.get("Request Count", "0") != "0"
    ]


def failures_table(rows: list[dict]) -> Table:
    """Locust's failures grouped by their error (the status and the server's message), most frequent first."""
    counted = sorted(rows, key=lambda r: -int(r.get("Occurrences", 0) or 0))
    return ["request", "error", "occurrences"], [[r["Name"], r["Error"], r["Occurrences"]] for r in counted]


def breakdown_plot(breakdown: dict, path: Path) -> Path | None:
    """Stacked bars: per ensemble step, µs in queue / input / infer / output."""
    if not breakdown:
        return None
    plt = pyplot()

    steps = [(ensemble, r) for ensemble, rows in breakdown.items() for r in rows if r["model"] != ensemble]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(steps)))
    left = [0.0] * len(steps)
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        values = [r[f"{phase}_us"] for _, r in steps]
        ax.barh([f"{e}: {r['model']}" for e, r in steps], values, left=left, label=phase)
        left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("µs per request")
    ax.legend(fontsize=7)
    return save(fig, path)


def accuracy_plot(perf_rows: list[dict], manifest: dict, path: Path) -> Path | None:
    """Accuracy (manifest) against best throughput, one point per variant with an accuracy."""
    known = {m: r for m, r in best_per_model(perf_rows).items() if manifest.get(m, {}).get("accuracy") is not None}
    points = [
        (m, _num(r, "throughput"), manifest[m]["accuracy"], manifest[m].get("precision", "?")) for m, r in known.items()
    ]
    if not points:
        return None
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for model, tput, accuracy, precision in points:
        ax.scatter(tput, accuracy)
        ax.annotate(f"{model} ({precision})", (tput, accuracy), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("best throughput (infer/s)")
    ax.set_ylabel("held-out accuracy")
    ax.grid(alpha=0.3)
    return save(fig, path)


def _markdown_table(table: Table) -> str:
    head, rows = table
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def _html_table(table: Table) -> str:
    head, rows = table
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def build_report(run: Path, repo: Path | None, earlier: Path | None = None, prometheus: str | None = None) -> Path:
    """Write run/report.md and run/report.html from what the run folder holds; return the md path.

    prometheus: a Prometheus URL; adds the server-side view of the run's window (window.json).
    """
    perf_rows, environment = read_perf(run / "perf.csv"), _json(run / "environment.json")
    manifest = _json(repo / "manifest.json").get("models", {}) if repo else {}
    others = _sibling_runs(run)
    sections: list[tuple[str, Table | None, Path | None]] = [
        ("CPU vs GPU vs TensorRT", runtime_table(perf_rows, manifest, environment, others), None)
    ]
    if perf_rows:
        plot = throughput_vs_latency(perf_rows, run / "perf.png")
        sections.append(("perf_analyzer: every point", perf_table(perf_rows), plot))
        accuracy = accuracy_plot(perf_rows, manifest, run / "accuracy_speed.png")
        if accuracy is not None:
            sections.append(("Accuracy vs speed", None, accuracy))
        paid = precision_table(perf_rows, manifest)
        if paid[1]:
            sections.append(("Did each precision pay?", paid, None))
    described = environment.get("models") or {}
    if described:
        sections.append(
            (
                f"Server: {environment.get('server', {}).get('url', '?')} (tritonserver "
                f"{environment.get('tritonserver', '?')}), models as it describes them",
                server_table(described),
                None,
            )
        )
    unreachable = environment.get("server", {}).get("unreachable")
    if unreachable:
        url = environment["server"].get("url", "?")
        sections.append((f"Server: {url} did not answer after the run ({unreachable})", None, None))
    failed = _json(run / "failed.json")
    if failed:  # points that gave no measurement: each with why (the server's answer, perf_analyzer's own)
        rows = [[f["model"], f["point"], f["why"]] for f in failed]
        sections.append((f"Failed points ({len(failed)}), and why", (["model", "point", "why"], rows), None))
    skipped = _json(run / "skipped.json")
    if skipped:
        sections.append(("Not measured, and why", (["model", "why"], [[m, w] for m, w in skipped.items()]), None))
    breakdown = _json(run / "breakdown.json")
    if breakdown:
        sections.append(("Latency per ensemble step", None, breakdown_plot(breakdown, run / "breakdown.png")))
    locust = read_csv(run / "locust_stats.csv")
    if locust:
        history_png = run / "locust_history.png"
        sections.append(("Locust", locust_table(locust), history_png if history_png.exists() else None))
    failures = read_csv(run / "locust_failures.csv")
    if failures:  # refusals say why: an overload's "reset reason: overflow", a model's full queue, ...
        sections.append(("Failures, by what the server answered", failures_table(failures), None))
    if prometheus:
        from tpserve.loadtest.reporting.server_view import view

        found = view(run, prometheus)
        if found:
            sections.append(("Server side (Prometheus, the run's window)", *found))
    if earlier is not None:
        history = history_table(perf_rows, read_perf(earlier / "perf.csv"))
        if history[1]:
            sections.append((f"Change against {earlier.name}", history, None))
        else:
            sections.append(
                (
                    f"Change against {earlier.name}: none of its points matches this run's "
                    "(model, protocol, batch, load)",
                    None,
                    None,
                )
            )
    elif perf_rows and others:
        sections.append(
            (
                "Change against an earlier run: none beside this one measured the same points "
                "(model, protocol, batch, load)",
                None,
                None,
            )
        )
    _write(run, sections, environment)
    return run / "report.md"


def server_table(described: dict) -> Table:
    """Each model as the server describes it."""
    rows = []
    for model, d in described.items():
        groups = ", ".join(f"{g['count']}x {g['kind']}" for g in d.get("instance_groups", [])) or "—"
        rows.append(
            [
                model,
                d.get("platform", d.get("error", "?")),
                str(d.get("max_batch_size", "?")),
                d.get("batching", "?"),
                groups,
                "yes" if d.get("decoupled") else "no",
            ]
        )
    return ["model", "platform / backend", "max batch", "batching", "instances", "decoupled"], rows


def _sibling_runs(run: Path) -> list[Path]:
    """Other run folders beside run that hold a perf.csv (earlier ones first)."""
    if not run.parent.is_dir():
        return []
    return sorted(p for p in run.parent.iterdir() if p != run and (p / "perf.csv").exists())


def precision_table(perf_rows: list[dict], manifest: dict) -> Table:
    """Each reduced-precision variant's best throughput against its fp32 model's, and whether it paid."""
    best, rows = best_per_model(perf_rows), []
    for model, row in best.items():
        entry = manifest.get(model, {})
        base = entry.get("spec", {}).get("name")  # the fp32 model a variant was built from
        if entry.get("precision") in (None, "fp32") or base == model or base not in best:
            continue
        ratio = _num(row, "throughput") / max(_num(best[base], "throughput"), 1e-9)
        verdict = "paid" if ratio > 1.05 else ("no gain" if ratio >= 0.95 else "did not pay: slower than fp32 here")
        built = entry.get("int8", {}).get("int8_speedup")  # the building host's CPU, batch 32 (builders/build.py)
        at_build = "?" if built is None else f"{built:.2f}x" + (" (slower)" if built < 1 else "")
        rows.append([model, entry.get("precision", "?"), base, f"{ratio:.2f}x", at_build, verdict])
    return ["variant", "precision", "against", "best infer/s vs fp32", "at its build", "verdict"], rows


def write_context(run: Path, ep, models: list[str]) -> None:
    """environment.json (versions, host, and the server's own description: version, extensions, each model's
    platform or backend, batching and instance groups, as it reports them) and breakdown.json (ensembles)."""
    from tpserve.builders.environment import host_info, tool_versions
    from tpserve.clients.breakdown import breakdown, ensemble_steps
    from tpserve.clients.connection import as_dict

    headers = ep.headers or None
    try:
        with ep.client() as client:
            server = as_dict(client.get_server_metadata(headers=headers))
            described = {m: _describe_model(client, m, headers) for m in models}
            ensembles = [m for m in models if ensemble_steps(client, m)]
    except Exception as err:  # the server went away during the run: the report still comes, saying so
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        step(f"the server at {ep.url} did not answer after the run ({reason}): the report has no server description")
        server, described, ensembles = {"unreachable": reason}, {}, []
    environment = {
        "versions": tool_versions(),
        "host": host_info(),
        "tritonserver": server.get("version"),
        "server": {
            "url": ep.url,
            "protocol": ep.protocol,
            "name": server.get("name"),
            "version": server.get("version"),
            "extensions": server.get("extensions", []),
            **({"unreachable": server["unreachable"]} if "unreachable" in server else {}),
        },
        "models": described,
    }
    (run / "environment.json").write_text(json.dumps(environment, indent=2))
    steps = {m: breakdown(ep, m) for m in ensembles} if ep.admin_headers else {}
    (run / "breakdown.json").write_text(json.dumps(steps, indent=2))


def _describe_model(client, model: str, headers) -> dict:
    """What the server says of a model: platform/backend, max_batch_size, batching, instance groups."""
    from tpserve.clients.connection import as_dict

    try:
        config = as_dict(client.get_model_config(model, headers=headers))
    except Exception as err:  # not exposed by this server
        return {"error": str(err).splitlines()[0]}
    config = config.get("config", config)
    batching = "dynamic" if "dynamic_batching" in config else "sequence" if "sequence_batching" in config else "none"
    groups = [
        {"kind": g.get("kind", "KIND_AUTO"), "count": int(g.get("count", 1)), "gpus": g.get("gpus", [])}
        for g in config.get("instance_group", [])
    ]
    return {
        "platform": config.get("platform") or config.get("backend", ""),
        "max_batch_size": int(config.get("max_batch_size", 0) or 0),
        "batching": batching,
        "instance_groups": groups,
        "decoupled": bool(config.get("model_transaction_policy", {}).get("decoupled")),
    }


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _write(run: Path, sections, environment: dict) -> None:
    md, body = [f"# Report: {run.name}"], []
    for title, table, image in sections:
        md.append(f"## {title}")
        body.append(f"<h2>{html.escape(title)}</h2>")
        if table is not None:
            md.append(_markdown_table(table))
            body.append(_html_table(table))
        if image is not None:
            md.append(f"![{title}]({image.name})")
            body.append(f'<img src="{image.name}" alt="{html.escape(title)}">')
    env = json.dumps(environment, indent=2)
    md.append(f"## Environment\n\n```json\n{env}\n```")
    body.append(f"<h2>Environment</h2><pre>{html.escape(env)}</pre>")
    (run / "report.md").write_text("\n\n".join(md) + "\n")
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc}"
    (run / "report.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{run.name}</title>"
        f"<style>{style}</style></head><body><h1>Report: {run.name}</h1>{''.join(body)}"
        "</body></html>\n"
    )
