"""The plan's report folder: plan.md (and plan.html beside it), plan.png (each trial's p99 against the rate it
was offered, the SLO drawn across), plan.json (everything)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tpserve.loadtest.planning.deployment import counted, repository_for, start_command
from tpserve.loadtest.planning.plan import Plan
from tpserve.loadtest.planning.search import TARGET_UTILISATION
from tpserve.loadtest.planning.trial import MEETS, Trial, refused


def _ms(value: float) -> str:
    return "—" if value != value or value == float("inf") else f"{value:.1f}"


def _numbered(plan: Plan) -> list[tuple[str, Trial]]:
    """Every trial with its label in the report: its number, or what it was for."""
    named = [(f"{i + 1}", t) for i, t in enumerate(plan.found.trials)]
    named += [("closing (missed)", t) for t in plan.found.overruled]
    named += [(label, t) for label, t in (("closing", plan.closing), ("headroom", plan.headroom)) if t is not None]
    return named


def _trial_rows(plan: Plan) -> list[str]:
    rows = [
        "| # | deployment | replay | offered /s | answered /s | p99 ms | failed | over SLO | queue µs | compute µs | "
        "verdict |",
        "|" + "---|" * 11,
    ]
    for label, t in _numbered(plan):
        replay = f"x{t.speed:g}{', first seconds' if t.probe else ', whole'}"
        phases = t.phases_us or {}
        rows.append(
            f"| {label} | {t.deployment.label()} | {replay} | {t.offered_per_s:.1f} | {t.answered_per_s:.1f} | "
            f"{_ms(t.p99_ms)} | {t.failed} | {t.over_slo} | {phases.get('queue_us', 0):.0f} | "
            f"{phases.get('compute_us', 0):.0f} | {t.verdict}: {t.why} |"
        )
    return rows


def _choice(plan: Plan) -> list[str]:
    request, chosen, closing = plan.request, plan.found.chosen, plan.closing
    if chosen is None or closing is None:
        hint = _refusals_hint(plan)
        return [
            f"**Nothing this host can run meets p99 ≤ {request.slo_p99_ms:g} ms at x{request.growth:g}**: the "
            f"largest deployment tried ({plan.space.sizes()[-1].label()}) missed "
            f"({plan.found.largest_miss.why if plan.found.largest_miss else 'not measured'}).{hint}",
            "",
        ]
    repository = repository_for(request.repo, chosen.deployment, request.out / "deployments" / chosen.deployment.slug())
    held = "holds" if closing.verdict == MEETS else "**does not hold**"
    if closing.verdict == MEETS:
        lines = [f"**Run {chosen.deployment.label()}.** Start it with:"]
    else:
        lines = [
            f"**No deployment this host can run held the closing replay**: the search's trials of "
            f"{chosen.deployment.label()} met p99 ≤ {request.slo_p99_ms:g} ms, but a fresh replay of the whole "
            f"recording did not ({closing.why}). Do not launch on it: {_advice(plan, closing)} The deployment "
            "closed last was started with:"
        ]
    lines += ["", "```sh", start_command(chosen.deployment, repository), "```", ""]
    if repository != request.repo:
        lines += [
            f"`{repository}` is your repository with these knobs written into each model's config "
            "(model files linked, not copied): serve it, or copy its configs into yours.",
            "",
        ]
    lines += [
        f"**Closing replay** (the whole recording at x{request.growth:g}, a fresh start of the choice): p99 "
        f"**{_ms(closing.p99_ms)} ms** against the SLO of {request.slo_p99_ms:g} ms, {closing.sent} requests, "
        f"{closing.failed} failed: the plan {held}."
        + (
            ""
            if plan.found.overruled
            else f" The search's own trial of it predicted p99 {_ms(_predicted(plan, chosen.deployment))} ms."
        ),
        "",
    ]
    for earlier in plan.found.overruled:
        lines += [
            f"The closing replay of {earlier.deployment.label()}, the search's first choice, missed ({earlier.why}): "
            "the plan moved to the next size and closed that.",
            "",
        ]
    if closing.phases_us:
        lines += [
            f"**Where the time goes** (the closing replay, per request, from the server's statistics): "
            f"{closing.phases_us['queue_us']:.0f} µs waiting in the queue, {closing.phases_us['compute_us']:.0f} µs "
            "computing.",
            "",
        ]
    lines += _headroom(plan)
    return lines


def _refusals_hint(plan: Plan) -> str:
    """Where nothing met: what the edge's bound on waiting requests did in the trials it refused in."""
    from tpserve.server.edge.admission import waiting_bound

    trials = [t for _, t in _numbered(plan)]
    refusing = [t for t in trials if refused(t)]
    if not refusing:
        return ""
    last = refusing[-1]
    most = max(t.deployment.max_waiting for t in trials)
    if most > last.deployment.max_waiting:
        now = last.deployment.max_waiting or waiting_bound(plan.request.repo)
        return (
            f" In {counted(len(refusing), 'trial')} the edge refused bursts past {now} requests waiting on a "
            f"replica; with {most} allowed to wait, they waited past the SLO instead."
        )
    return f" In {counted(len(refusing), 'trial')}, {_advice(plan, last)}"


def _advice(plan: Plan, closing: Trial) -> str:
    """What to try where the closing replay failed: where the edge refused past the requests that may wait (a
    burst in the recording), a larger bound; otherwise more of this host's sizes, or more hosts."""
    from tpserve.server.edge.admission import waiting_bound

    count = refused(closing)
    if count:
        now = closing.deployment.max_waiting or waiting_bound(plan.request.repo)
        return (
            f"{count} of the failures were the edge refusing past the {now} requests that may wait on a replica "
            f"(a burst of the recording): plan again with a larger bound (MAX_WAITING={2 * now}), or allow more "
            "replicas (MAX_REPLICAS=, on hosts of their own)."
        )
    return "allow more instances (--instances) or replicas (MAX_REPLICAS=, on hosts of their own), and plan again."


def _predicted(plan: Plan, deployment) -> float:
    """The p99 the search's whole replay of the deployment measured (the probe's where it had none)."""
    mine = [t for t in plan.found.trials if t.deployment == deployment]
    whole = [t for t in mine if not t.probe]
    return (whole or mine)[-1].p99_ms if mine else float("nan")


def _headroom(plan: Plan) -> list[str]:
    closing, probe, request = plan.closing, plan.headroom, plan.request
    assert closing is not None
    lines = [f"**Headroom**: p99 is {closing.p99_ms / request.slo_p99_ms:.0%} of the SLO"]
    if probe is not None:
        lines[0] += (
            f"; at x{probe.speed:g} ({request.headroom:g} times the growth, the first seconds) the choice "
            f"{'still meets it' if probe.verdict == MEETS else 'misses it'} ({probe.why})"
        )
    if plan.capacity_per_replica:
        capacity = plan.capacity_per_replica * closing.deployment.replicas
        lines[0] += (
            f"; its estimated capacity is {capacity:.0f} requests/s, {capacity / max(closing.offered_per_s, 1e-9):.1f}x"
            " the rate offered"
        )
    return [lines[0] + ".", ""]


def _beyond(plan: Plan) -> list[str]:
    """Kubernetes' replica count: the measured choice's, or (nothing on this host met the SLO) an extrapolation
    from what one replica sustained."""
    chosen = plan.found.chosen
    each = "one GPU each" if plan.space.gpus else "each a pod of this host's shape"
    if chosen is not None and (plan.closing is None or plan.closing.verdict != MEETS):
        return ["## On Kubernetes", "", "No replica count to apply: the closing replay did not hold (above).", ""]
    if chosen is not None:
        return [
            "## On Kubernetes",
            "",
            f"{counted(chosen.deployment.replicas, 'replica')} ({each}; kubernetes/deployment.yaml), the measured "
            "choice:",
            "",
            "```sh",
            f"kubectl scale deployment/triton --replicas={chosen.deployment.replicas}",
            "```",
            "",
        ]
    if plan.capacity_per_replica is None or plan.replicas_for_growth is None:
        return [
            "Per-replica capacity: not measured (no trial overloaded a replica), so no extrapolation beyond the sizes "
            "tried.",
            "",
        ]
    request, needed = plan.request, plan.replicas_for_growth
    return [
        "## Beyond this host (an extrapolation, not a measurement)",
        "",
        f"One replica sustained at most {plan.capacity_per_replica:.0f} requests/s when overloaded. At "
        f"{request.growth:g}x the recorded rate ({plan.traffic.rate * request.growth:.0f} requests/s) and "
        f"{TARGET_UTILISATION:.0%} utilisation that is **{counted(needed, 'replica')}** ({each}), "
        + (
            f"more than the {plan.space.max_replicas} this host runs."
            if needed > plan.space.max_replicas
            else f"each with a host of its own: {plan.space.max_replicas} replicas on this one share its "
            f"{'GPUs' if plan.space.gpus else 'cores'} and missed."
        )
        + " On Kubernetes (kubernetes/deployment.yaml):",
        "",
        "```sh",
        f"kubectl scale deployment/triton --replicas={needed}",
        "```",
        "",
        "Linear scaling across replicas is assumed: replay the recording against that deployment to measure it.",
        "",
    ]


def plot(plan: Plan, path: Path) -> Path:
    """Each trial's p99 against the rate offered, one marker per deployment (hollow: a probe), the SLO across."""
    from tpserve.loadtest.reporting.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    trials = [t for t in [*plan.found.trials, plan.closing, plan.headroom] if t is not None]
    for label in dict.fromkeys(t.deployment.label() for t in trials):
        mine = [t for t in trials if t.deployment.label() == label]
        for probe in (False, True):
            points = [(t.offered_per_s, min(t.p99_ms, 1e6)) for t in mine if t.probe == probe]
            if points:
                ax.scatter(
                    *zip(*points),
                    label=f"{label}{' (probe)' if probe else ''}",
                    facecolors="none" if probe else None,
                    edgecolors="C0" if probe else None,
                )
    ax.axhline(plan.request.slo_p99_ms, color="red", linestyle="--", label=f"SLO {plan.request.slo_p99_ms:g} ms")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("p99 latency (ms, log)")
    ax.set_title(f"Plan trials: p99 against offered rate (x{plan.request.growth:g} of the recording)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def write(plan: Plan, command: str) -> Path:
    """plan.md, plan.html, plan.png, plan.json in the plan's folder; returns plan.md's path."""
    from tpserve.loadtest.reporting.html_page import write_html

    request, traffic, out = plan.request, plan.traffic, plan.request.out
    plot(plan, out / "plan.png")
    lines = [
        f"# Capacity plan: x{request.growth:g} of the recorded traffic at p99 ≤ {request.slo_p99_ms:g} ms",
        "",
        f"Recording {request.recording}: {traffic.requests} answered requests of {', '.join(traffic.models)} over "
        f"{traffic.seconds:.1f} s ({traffic.rate:.1f}/s); replayed open loop at x{request.growth:g} "
        f"({traffic.rate * request.growth:.1f}/s)." + (f" Left out: {traffic.left_out}." if traffic.left_out else ""),
        f"Host: {os.cpu_count()} cores"
        + (f", {plan.space.gpus} GPU(s)" if plan.space.gpus else "")
        + f"; {time.strftime('%Y-%m-%d')}; command: `{command}`.",
        "",
        *_choice(plan),
        *_beyond(plan),
        "## Every trial",
        "",
        "Each deployment was started fresh on free ports, one replica as `serve` starts it (the checks in the "
        "server), more as `cluster` does. A probe replays the first seconds; a probe whose slow or failed answers "
        "alone exceed 1% of the whole replay's requests is a clear miss, and the whole replay is skipped.",
        "",
        *_trial_rows(plan),
        "",
        *_generator(plan),
        "![p99 against offered rate](plan.png)",
        "",
    ]
    path = out / "plan.md"
    path.write_text("\n".join(lines))
    write_html(path)
    (out / "plan.json").write_text(json.dumps(_as_json(plan), indent=2, default=str))
    return path


def _generator(plan: Plan) -> list[str]:
    """How the load was made, how far behind its schedule it fell, how busy it was; what the failures were."""
    trials = [t for _, t in _numbered(plan)]
    if not trials:
        return []
    behind = max(t.behind_ms for t in trials)
    busy = max(t.client_busy for t in trials)
    said = f"The load generator ({plan.request.generator}) fell at most {behind:.0f} ms behind its schedule"
    said += f"; its busiest process used at most {busy:.0%} of a core." if busy else "."
    failed = [(number, t.failures) for number, t in _numbered(plan) if t.failures]
    if not failed:
        return [said, ""]
    lines = [said, "", "What the failed requests got, by trial:", ""]
    lines += [f"- {number}: " + ", ".join(f"{what} ×{count}" for what, count in got.items()) for number, got in failed]
    return [*lines, ""]


def _as_json(plan: Plan) -> dict:
    def trial(t: Trial | None):
        return None if t is None else t.to_dict()

    return {
        "slo_p99_ms": plan.request.slo_p99_ms,
        "growth": plan.request.growth,
        "recorded_per_s": plan.traffic.rate,
        "requests": plan.traffic.requests,
        "chosen": trial(plan.found.chosen),
        "closing": trial(plan.closing),
        "headroom": trial(plan.headroom),
        "capacity_per_replica": plan.capacity_per_replica,
        "replicas_for_growth": plan.replicas_for_growth,
        "trials": [t.to_dict() for t in plan.found.trials],
    }
