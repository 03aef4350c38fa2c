"""`make replay`: a recording replayed through Locust, open loop, against any Triton; the report beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError, RecordingError
from tpserve.common.traffic import REPLAY_HEADER, read_recording
from tpserve.loadtest.locust_suite import GENERATORS
from tpserve.loadtest.locust_suite.run import forget_headers, log_tail, pass_headers
from tpserve.loadtest.workloads.recorded import schedule, write_schedule

LOCUSTFILE = Path(__file__).with_name("locustfiles") / "replay.py"


@dataclass(frozen=True, kw_only=True)
class Replay:
    """One replay: which recording, how fast, over which protocol (default: each request's own), which models."""

    recording: Path | None = None
    workload: Path | None = None  # a fitted workload (loadtest/workloads/fitted.py) instead of a recording
    scale: float = 1.0  # the workload's rates times this
    seed: int = 0
    speed: float = 1.0
    protocol: str = ""
    models: tuple[str, ...] = ()
    headers: dict = field(default_factory=dict)  # sent with every request; passed through a 0600 file
    tls: bool = False
    ca_file: str = ""
    connections: int = 64  # HTTP connections at most (gRPC: one channel)
    max_seconds: float = 0.0  # only the schedule's first seconds (0: all of it)
    target: str = ""  # every request to this model instead (a variant of the recorded one; made-up values)
    generator: str = "locust"  # or "fast": workloads/open_loop.py, worker processes, for rates Locust cannot hold
    processes: int = 0  # the fast generator's (0: enough for the rate, within half the cores)


def run_replay(replay: Replay, http_url: str, grpc_url: str, repo: Path | None, out: Path) -> dict:
    """Replay; return what the report needs: the recording, the schedule's left-outs, the results, the log.

    Raises:
        RecordingError: no recording, or nothing in it to replay.
        MeasurementError: Locust failed.
    """
    if replay.generator not in GENERATORS:
        raise MeasurementError(f"GENERATOR={replay.generator}: the replay's generators are {', '.join(GENERATORS)}")
    out.mkdir(parents=True, exist_ok=True)
    recorded, items, left_out = _requests(replay)
    items = _narrowed(items, replay)
    path = write_schedule(items, out / "schedule.jsonl")
    duration = items[-1].offset_s
    source = f"speed {replay.speed:g}) from {replay.recording}" if replay.recording else f"x{replay.scale:g}) from"
    step(f"replay: {len(items)} requests over {duration:.0f} s ({source} {replay.workload or ''}".rstrip())
    if replay.generator == "fast":
        found = _run_fast(replay, items, http_url, grpc_url, repo, out)
        return {"recorded": recorded, "left_out": left_out, "results": found, "items": items}
    results = out / "replay_results.jsonl"
    env = _environment(replay, http_url, grpc_url, repo, path, results, out)
    _run_locust(env, out, timeout=duration + 300)
    return {"recorded": recorded, "left_out": left_out, "results": read_results(results), "items": items}


def _run_fast(replay: Replay, items: list, http_url: str, grpc_url: str, repo: Path | None, out: Path) -> dict:
    from tpserve.loadtest.workloads.open_loop import Target, processes_for, run_open_loop

    target = Target(
        http_url=http_url,
        grpc_url=grpc_url,
        headers={**replay.headers, REPLAY_HEADER: "1"},
        tls=replay.tls,
        ca_file=replay.ca_file,
        connections=replay.connections,
    )
    processes = replay.processes or processes_for(items)
    step(f"replay: the fast generator, {processes} process{'es' if processes > 1 else ''}")
    found = run_open_loop(items, repo, target, out, processes)
    late = found["behind_s"] * 1000
    step(
        f"replay: {len(items)} requests sent, at most {late:.0f} ms behind schedule; busiest client process "
        f"{found['client_busy']:.0%} of a core"
    )
    return found


def _requests(replay: Replay) -> tuple[list, list, Counter]:
    """What was recorded (a workload: what it generated, as if recorded), the schedule, what was left out."""
    if replay.workload is None:
        assert replay.recording is not None, "a replay has a recording or a workload"
        recorded = list(read_recording(replay.recording))
        return (recorded, *schedule(recorded, replay.speed, replay.protocol, replay.models))
    from tpserve.common.traffic import RecordedRequest
    from tpserve.loadtest.workloads.fitted import generate, read_workload

    items = generate(read_workload(replay.workload), replay.scale, replay.seed, replay.protocol)
    if replay.models:
        items = [i for i in items if i.model in replay.models]
    if not items:
        raise RecordingError(f"the workload {replay.workload} generates no request (models {replay.models or 'all'})")
    as_recorded = [
        RecordedRequest(
            arrival_us=int(i.offset_s * 1e6),
            model=i.model,
            protocol=i.protocol,
            inputs=i.inputs,
            status=200 if i.protocol == "http" else 0,
        )
        for i in items
    ]
    return as_recorded, items, Counter()


def _narrowed(items: list, replay: Replay) -> list:
    """The schedule's first max_seconds, each request sent to the target model (its recorded body, which may name
    the recorded model, left for made-up values of the same shapes)."""
    from dataclasses import replace

    if replay.max_seconds > 0:
        items = [i for i in items if i.offset_s <= replay.max_seconds]
    if replay.target:
        items = [replace(i, model=replay.target, version="", values=None) for i in items]
    if not items:
        raise RecordingError(f"nothing to replay in the first {replay.max_seconds:g} s")
    return items


def _environment(replay: Replay, http_url, grpc_url, repo, schedule_path, results, out: Path) -> dict:
    env = dict(os.environ)
    env.update(
        TRITON_REPLAY_SCHEDULE=str(schedule_path),
        TRITON_REPLAY_RESULTS=str(results),
        TRITON_HTTP_URL=http_url,
        TRITON_GRPC_URL=grpc_url,
        TRITON_REPO=str(repo or ""),
        TRITON_TLS="1" if replay.tls else "",
        TRITON_CA_FILE=replay.ca_file,
        TRITON_REPLAY_CONNECTIONS=str(replay.connections),
    )
    pass_headers(env, {**replay.headers, REPLAY_HEADER: "1"}, out)  # a recording server marks them replayed
    return env


def _run_locust(env: dict, out: Path, timeout: float) -> None:
    prefix, log = out / "locust", out / "locust.log"
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "1", "-r", "1"]
    command += ["-t", f"{int(timeout)}s", "--csv", str(prefix), "--html", f"{prefix}.html", "--only-summary"]
    started = time.monotonic()
    try:
        with open(log, "w") as handle:
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert process.stdout is not None  # a pipe
            for line in process.stdout:  # progress lines shown, everything kept
                handle.write(line)
                handle.flush()
                if line.startswith("replay:"):
                    step(line.strip())
                if time.monotonic() - started > timeout + 60:
                    process.kill()
            code = process.wait()
    finally:
        forget_headers(out)
    if code not in (0, 1) or not (out / "replay_results.jsonl").exists():
        raise MeasurementError(
            f"the replay's Locust run failed (exit {code}); its log ({log}) ends:\n{log_tail(log, 8)}"
        )


def read_results(path: Path) -> dict:
    """replay_results.jsonl: {'behind_s': worst lateness, 'sent': [one dict per request, in sending order]}."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {"behind_s": lines[0]["behind_s"] if lines else 0.0, "sent": lines[1:]}
