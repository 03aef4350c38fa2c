"""A real Prometheus scraping two replicas and Envoy while Locust (a master and 2 worker processes)
drives load through Envoy: the recorded series hold real values that agree with Locust's own count,
and every query of the Grafana dashboard evaluates."""

import time

import pytest

from tpserve.builders.build import build_model
from tpserve.builders.repository.writer import ServingOptions
from tpserve.builders.request import BuildRequest
from tpserve.common import endpoints
from tpserve.loadtest.locust_suite.run import LocustRun, read_stats, run_locust
from tpserve.loadtest.monitoring import dashboard
from tpserve.loadtest.monitoring import prometheus_server as prom
from tpserve.loadtest.monitoring.prometheus_rules import (
    BUSY,
    P99,
    QUEUE_PER_REQUEST,
    REPLICAS_NEEDED,
    REQUESTS,
    THROUGHPUT,
    RuleSettings,
)
from tpserve.loadtest.monitoring.prometheus_tools import find_tool
from tpserve.loadtest.reporting.report import build_report
from tpserve.server.cluster import ClusterSettings, start_cluster
from tpserve.server.stack import stop_stack

pytestmark = [
    pytest.mark.functional,
    pytest.mark.skipif(find_tool("prometheus") is None, reason="prometheus not installed: make install-prometheus"),
]
RULES = RuleSettings(window="10s")


@pytest.fixture(scope="module")
def monitored(digits_build, tmp_path_factory):
    spec, built, _ = digits_build
    root = tmp_path_factory.mktemp("monitored")
    build_model(
        BuildRequest(
            spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work", options=ServingOptions()
        ),
        built,
    )
    http_port, grpc_port, admin_port, prom_port = endpoints.free_ports(4)
    settings = ClusterSettings(
        root / "repo",
        replicas=2,
        http_port=http_port,
        grpc_port=grpc_port,
        admin_port=admin_port,
        state_dir=root / "state",
    )
    start_cluster(settings)
    try:
        state = prom.start(settings.state_dir, prom_port, interval="1s", rules=RULES)
        yield settings, state["url"], root
    finally:
        prom.stop(settings.state_dir)
        stop_stack(settings.state_dir)


def _counter(url: str, at: float) -> float:
    return prom.scalar(prom.query(url, 'sum(nv_inference_request_success{model="digits_cnn"})', at))


def _await_scrape_after(url: str, moment: float, timeout: float = 15.0) -> float:
    """A time at which every target has been scraped after `moment`; returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stamps = [float(r["value"][1]) for r in prom.query(url, "timestamp(up)")]
        if stamps and min(stamps) > moment:
            return time.time()
        time.sleep(0.5)
    raise AssertionError("prometheus did not scrape every target in time")


def test_recorded_series_agree_with_locusts_count(monitored):
    settings, url, root = monitored
    deadline = time.monotonic() + 20
    while len(prom.query(url, "up == 1")) < 3:  # two replicas and Envoy, scraped and up
        assert time.monotonic() < deadline, prom.query(url, "up")
        time.sleep(0.5)
    before = _await_scrape_after(url, time.time())
    start_count = _counter(url, before)
    run = LocustRun(models=(("digits_cnn", 1),), protocol="http", users=4, spawn_rate=4, run_time_s=15, processes=2)
    result = run_locust(run, endpoints.read_state(settings.state_dir), root / "locust")
    after = _await_scrape_after(url, time.time())
    locust_ok = sum(r["requests"] - r["failures"] for r in result.rows if r["name"] != "Aggregated")
    served = _counter(url, after) - start_count
    print(f"locust (2 workers): {locust_ok} successful requests; prometheus: {served:.0f} (counter increase)")
    assert locust_ok > 100
    assert abs(served - locust_ok) <= 0.10 * locust_ok, (served, locust_ok)
    rate = prom.query_range(url, f'{REQUESTS}:rate{RULES.window}{{model="digits_cnn"}}', after - 20, after, 1)
    peak = max(float(v) for series in rate for _, v in series["values"])
    assert 0.5 * locust_ok / run.run_time_s < peak < 2.0 * locust_ok / run.run_time_s, (peak, locust_ok)
    assert (
        prom.scalar(prom.query(url, f'max_over_time({THROUGHPUT}:rate{RULES.window}{{model="digits_cnn"}}[30s])')) > 0
    )
    queued = prom.query(url, f'max_over_time({QUEUE_PER_REQUEST}:rate{RULES.window}{{model="digits_cnn"}}[30s])')
    assert queued and float(queued[0]["value"][1]) >= 0
    p99 = prom.query(url, f'max_over_time({P99}:rate{RULES.window}{{model="digits_cnn"}}[30s])')
    assert p99 and 0 < float(p99[0]["value"][1]) < 5_000, p99  # ms, from the servers' latency summaries
    busy = prom.query(url, f'max_over_time({BUSY}:rate{RULES.window}{{model="digits_cnn"}}[30s])')
    assert busy and 0 < float(busy[0]["value"][1]) < 2 * 8, busy  # instance-seconds a second, 2 replicas
    needed = prom.query(url, f"max_over_time({REPLICAS_NEEDED}[30s])")
    assert needed and float(needed[0]["value"][1]) >= 1, needed


def test_the_report_gains_the_server_side_view(monitored):
    settings, url, root = monitored
    report = build_report(root / "locust", settings.repo, prometheus=url).read_text()
    assert "## Server side (Prometheus, the run's window)" in report
    row = next(line for line in report.splitlines() if line.startswith("| digits_cnn |"))
    served = float(row.split("|")[2].replace(",", ""))
    stats = read_stats(root / "locust" / "locust_stats.csv")
    locust = sum(r["requests"] for r in stats if r["name"] != "Aggregated")
    assert abs(served - locust) <= 0.10 * locust, (served, locust)
    assert (root / "locust" / "server_view.png").stat().st_size > 5_000


def test_every_dashboard_query_evaluates(monitored):
    _, url, _ = monitored
    empty = []
    for expr in dashboard.queries(RULES):
        if not prom.query(url, expr):  # raises on a query Prometheus rejects
            empty.append(expr)
    # Series that need a GPU, or a failure, may be empty on this host (Envoy makes its 5xx series at the first
    # one); the rest must hold data.
    assert all("gpu" in e or "failure" in e or 'code_class="5"' in e for e in empty), empty


def test_a_bad_query_is_reported_with_prometheus_reason(monitored):
    _, url, _ = monitored
    with pytest.raises(Exception, match="prometheus rejected"):
        prom.query(url, "sum(rate(nv_inference_count[5m])")
