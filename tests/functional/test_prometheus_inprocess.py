"""The alert rules with Triton's latency summaries off: a real Prometheus scrapes a real tritonserver serving an
in-process model (`LATENCY_SUMMARIES=0`). The p99 the rules record then comes from the in-process backend's own
histogram (triton_models/inprocess/native/metrics.c), and both alerts, queue time and p99, fire on it."""

import threading
import time

import numpy as np
import pytest

from tpserve.builders.build import build_model, build_torch_variant
from tpserve.builders.repository.writer import ServingOptions, TorchRuntime
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import zoo
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.loadtest.monitoring import prometheus_server as prom
from tpserve.loadtest.monitoring.prometheus_rules import P99, RuleSettings
from tpserve.loadtest.monitoring.prometheus_tools import find_tool
from tpserve.server.triton import launcher

pytestmark = [
    pytest.mark.functional,
    pytest.mark.skipif(find_tool("prometheus") is None, reason="prometheus not installed: make install-prometheus"),
]
MODEL = "resnet18_64_torch_fp32_inproc"
# budgets any request exceeds: the alerts must fire within the test's seconds
RULES = RuleSettings(window="10s", queue_budget_us=0.001, alert_for="0s", p99_budget_ms=0.001)


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    root = tmp_path_factory.mktemp("watched")
    spec = zoo.get_spec("resnet18", image_size=64, max_batch_size=4)
    work, repo = root / "work", root / "repo"
    build_model(
        BuildRequest(spec=spec, target="embedded", repo=root / "scratch", work_dir=work), zoo.build_module(spec)
    )
    request = BuildRequest(
        spec=spec, target="embedded", repo=repo, work_dir=work, options=ServingOptions(max_queue_delay_us=2000)
    )
    build_torch_variant(request, TorchRuntime(precision="fp32", inprocess=True))
    state_dir = root / "state"
    tuning = launcher.TritonTuning(latency_summaries=False)
    with launcher.running(repo, state_dir, tuning=tuning) as state:
        (port,) = endpoints.free_ports(1)
        try:
            url = prom.start(state_dir, port, interval="1s", rules=RULES)["url"]
            yield state, url
        finally:
            prom.stop(state_dir)


def _load(state, seconds: float, users: int = 4) -> int:
    """users closed-loop clients for `seconds`; returns the requests answered."""
    ep = state.endpoint("grpc")
    pixels = np.zeros((1, 3, 64, 64), np.float32)
    end, done = time.monotonic() + seconds, []

    def user():
        count = 0
        while time.monotonic() < end:
            infer(ep, MODEL, {"input": pixels})
            count += 1
        done.append(count)

    threads = [threading.Thread(target=user) for _ in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done)


def _firing(url: str) -> set[str]:
    found = prom.query(url, f'ALERTS{{alertstate="firing", model="{MODEL}"}}')
    return {series["metric"]["alertname"] for series in found}


def test_with_summaries_off_the_p99_comes_from_the_backend_and_the_alerts_fire(watched):
    state, url = watched
    assert _load(state, 12) > 20
    deadline, fired = time.monotonic() + 40, set()
    while time.monotonic() < deadline and fired != {"TritonScaleOut", "TritonLatencyHigh"}:
        fired = _firing(url)
        time.sleep(1)
    assert fired == {"TritonScaleOut", "TritonLatencyHigh"}, prom.query(url, "ALERTS")
    assert not prom.query(url, f'nv_inference_request_summary_us{{model="{MODEL}"}}')  # the summaries are off
    assert not prom.query(url, f'nv_inference_first_response_histogram_ms_count{{model="{MODEL}"}}')  # none in 2.51
    backend = prom.query(url, f'torch_inprocess_request_duration_ms_count{{model="{MODEL}"}}')
    assert backend and float(backend[0]["value"][1]) > 20, backend
    p99 = prom.query(url, f'max_over_time({P99}:rate{RULES.window}{{model="{MODEL}"}}[40s])')
    assert p99 and 0 < float(p99[0]["value"][1]) < 10_000, p99  # ms: ResNet-18 at 64 px on a CPU
