"""A real Prometheus for the server or cluster of a state folder: generated config, start, query, stop.

The scrape targets come from the state folder: every replica's metrics port (or the single server's)
and, for a cluster, Envoy's /stats/prometheus. Rules come from loadtest/monitoring/prometheus_rules.py.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import MeasurementError
from tpserve.loadtest.monitoring.prometheus_rules import DEFAULT_RULES, RuleSettings, rule_groups
from tpserve.server.triton.processes import terminate_group

STATE = "prometheus.json"


@dataclass(frozen=True)
class Target:
    """One scrape target."""

    job: str
    address: str  # host:port
    path: str = "/metrics"
    labels: dict = field(default_factory=dict)


def targets_of(state_dir: Path) -> list[Target]:
    """The replicas' metrics endpoints and Envoy's (a cluster), or the single server's; with admission by queue
    time, each replica's supervisor's /metrics too."""
    from tpserve.common.endpoints import read_state
    from tpserve.server.stack import is_stack, read_stack

    if not is_stack(state_dir):
        state = read_state(state_dir)
        return [Target("triton", f"{state.host}:{state.metrics_port}", labels={"replica": "server"})] + _supervisor(
            state_dir, state.host
        )
    cluster, found = read_stack(state_dir), []
    for replica in cluster.replicas:
        state = read_state(state_dir / replica.name)
        found.append(Target("triton", f"{state.host}:{state.metrics_port}", labels={"replica": replica.name}))
        if cluster.queue_slo:  # admission by queue time: what its supervisor measured and the edge refused
            address = f"{replica.host}:{replica.health_port}"
            found.append(Target("tpserve", address, "/metrics", labels={"replica": replica.name}))
    if cluster.stats_port:  # a single server behind the edge has no Envoy stats port
        found.append(Target("envoy", f"{cluster.host}:{cluster.admin_port}", "/stats/prometheus"))
    return found


def _supervisor(state_dir: Path, host: str) -> list[Target]:
    """A single supervised server's supervisor /metrics (its admission figures), where it runs with the checks in
    the server's admission table; none otherwise."""
    import json

    from tpserve.server.edge.admission_table import FILE

    record = state_dir / "supervisor.json"
    if not (state_dir / FILE).exists() or not record.exists():
        return []
    port = json.loads(record.read_text() or "{}").get("health_port")
    return [Target("tpserve", f"{host}:{port}", "/metrics", labels={"replica": "server"})] if port else []


def scrape_config(targets: list[Target], interval: str = "5s") -> dict:
    """prometheus.yml: one scrape job per target job name, the rules file beside it."""
    jobs: dict[str, list[Target]] = {}
    for target in targets:
        jobs.setdefault(target.job, []).append(target)
    scrape = []
    for job, members in jobs.items():
        configs = [{"targets": [t.address], "labels": t.labels} for t in members]
        scrape.append({"job_name": job, "metrics_path": members[0].path, "static_configs": configs})
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": ["rules.yml"],
        "scrape_configs": scrape,
    }


def find_prometheus() -> Path:
    """The prometheus binary ($PROMETHEUS_BINARY, .tools/prometheus/bin, then PATH).

    Raises:
        MeasurementError: not installed, with how to install it.
    """
    from tpserve.loadtest.monitoring.prometheus_tools import find_tool

    found = find_tool("prometheus")
    if not found:
        raise MeasurementError(
            "prometheus is not installed: `make install-prometheus` (unpacks Debian's package into .tools/, "
            "no root), or set PROMETHEUS_BINARY to a Prometheus binary"
        )
    return found


def served_instances(state_dir: Path) -> tuple[tuple[str, int], ...]:
    """Instances per replica of each model the server of state_dir serves (its repository's configs), for the
    replicas-needed rule; () where the repository cannot be read."""
    from tpserve.builders.repository.model_config import repository_configs
    from tpserve.common.endpoints import read_state
    from tpserve.common.errors import ServerError
    from tpserve.server.edge.admission import instances

    try:
        repo = Path(read_state(state_dir).repo)
        return tuple(
            (name, instances(config)) for name, config in repository_configs(repo) if config.platform != "ensemble"
        )
    except (OSError, ServerError):  # a state without a readable repository: one instance per model
        return ()


def start(state_dir: Path, port: int, interval: str = "5s", rules: RuleSettings = DEFAULT_RULES) -> dict:
    """Write the config and rules into STATE_DIR/prometheus/, start Prometheus on 127.0.0.1:port, await ready.
    The replicas-needed rule counts the served repository's instances per model."""
    import dataclasses

    import yaml

    if not rules.instances:
        rules = dataclasses.replace(rules, instances=served_instances(state_dir))

    binary, folder = find_prometheus(), state_dir / "prometheus"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(scrape_config(targets_of(state_dir), interval)))
    (folder / "rules.yml").write_text(yaml.safe_dump(rule_groups(rules), sort_keys=False))
    command = [
        str(binary),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    log = open(folder / "prometheus.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    state = {"pid": process.pid, "url": url, "folder": str(folder)}
    (state_dir / STATE).write_text(json.dumps(state))
    _await_ready(url, process, folder)
    step(f"prometheus: {url} scraping {len(targets_of(state_dir))} targets every {interval}")
    return state


def _await_ready(url: str, process: subprocess.Popen, folder: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MeasurementError(f"prometheus exited with code {process.returncode}; see {folder}/prometheus.log")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise MeasurementError(f"prometheus not ready after {timeout:.0f} s; see {folder}/prometheus.log")


def stop(state_dir: Path) -> bool:
    """Stop the Prometheus of state_dir; return whether one ran."""
    path = state_dir / STATE
    if not path.exists():
        return False
    pid = json.loads(path.read_text())["pid"]
    path.unlink()
    return terminate_group(pid)


def query(url: str, promql: str, at: float | None = None) -> list[dict]:
    """An instant query; the result vector.

    Raises:
        MeasurementError: Prometheus rejected the query (its error message).
    """
    params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
    return _api(url, "query", params)["result"]


def query_range(url: str, promql: str, start: float, end: float, step_s: float) -> list[dict]:
    """A range query; the result matrix."""
    params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
    return _api(url, "query_range", params)["result"]


def _api(url: str, endpoint: str, params: dict) -> dict:
    request = f"{url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        body = json.loads(err.read() or b"{}")
    if body.get("status") != "success":
        raise MeasurementError(f"prometheus rejected {params['query']!r}: {body.get('error', body)}")
    return body["data"]


def scalar(result: list[dict]) -> float:
    """Sum of an instant vector's values (0 for an empty result)."""
    return sum(float(r["value"][1]) for r in result)
