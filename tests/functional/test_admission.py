"""Admission by queue time through the edge (server/edge/cancel_notice.c, supervision/admission_control.py): a
model whose queue time per request is over its budget has its new calls refused at once, HTTP 429 and gRPC
UNAVAILABLE with a retry hint, counted in the supervisor's /metrics and Envoy's stats; only that model, and only
while it is over; the server stays up."""

import collections
import concurrent.futures
import contextlib
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tpserve.common import endpoints
from tpserve.server.edge.admission_table import Region
from tpserve.server.edge.front import admin_get, admin_socket, admission_of
from tpserve.server.single import one_behind_edge, start_single
from tpserve.server.stack import stop_stack

pytestmark = pytest.mark.functional
SLOW = Path(__file__).resolve().parent.parent / "fixtures" / "slow_model"


def _serve(repo: Path, state_dir: Path, queue_slo: str):
    settings = one_behind_edge(repo, state_dir, queue_slo=queue_slo)
    start_single(settings)
    return settings


def _metrics(settings) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{settings.health_port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def _envoy_refusals(settings) -> int:
    _, text = admin_get(admin_socket(settings.state_dir), "/stats?filter=refused_queue_time")
    return int(text.split(":")[-1])


def _http(url: str, model: str, name: str, data: np.ndarray, version: str = ""):
    started = time.monotonic()
    where = f"/versions/{version}" if version else ""
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}{where}/infer",
        data=(
            f'{{"inputs":[{{"name":"{name}","shape":{list(data.shape)},"datatype":"FP32",'
            f'"data":{data.flatten().tolist()}}}]}}'
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, None, time.monotonic() - started
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("retry-after"), time.monotonic() - started


def _grpc(stub, model: str, name: str, data: np.ndarray):
    message = service_pb2.ModelInferRequest(model_name=model)
    message.inputs.add(name=name, datatype="FP32", shape=list(data.shape))
    message.raw_input_contents.append(data.tobytes())
    try:
        stub.ModelInfer(message, timeout=60)
        return "OK", None
    except grpc.RpcError as err:
        return err.code().name, dict(err.trailing_metadata() or ()).get("grpc-retry-pushback-ms")


def test_a_model_over_its_queue_budget_is_refused_at_once_then_admitted_again(tmp_path):
    shutil.copytree(SLOW, tmp_path / "repo")  # a quarter of a second a request, one instance
    settings = _serve(tmp_path / "repo", tmp_path / "state", "slow=100")
    try:
        front = endpoints.read_state(settings.state_dir)
        pid = endpoints.read_state(settings.state_dir / "replica-0").pid
        x = np.ones((1, 1), np.float32)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(front.grpc_url))
        deadline = time.monotonic() + 8

        def flood_http(_):
            seen = []
            while time.monotonic() < deadline:
                seen.append(_http(front.http_url, "slow", "X", x))
            return seen

        def flood_grpc(_):
            seen = []
            while time.monotonic() < deadline:
                seen.append(_grpc(stub, "slow", "X", x))
            return seen

        with concurrent.futures.ThreadPoolExecutor(12) as pool:  # both protocols at once
            over_http = [pool.submit(flood_http, i) for i in range(6)]
            over_grpc = [pool.submit(flood_grpc, i) for i in range(6)]
            http = [a for done in over_http for a in done.result()]
            grpc_answers = [a for done in over_grpc for a in done.result()]
        print(
            f"http {collections.Counter(s for s, _, _ in http)}, grpc {collections.Counter(c for c, _ in grpc_answers)}"
        )
        refused = [(hint, took) for status, hint, took in http if status == 429]
        assert refused and all(hint == "1" for hint, _ in refused), http[:20]
        assert sorted(took for _, took in refused)[len(refused) // 2] < 0.5, "refused at once, not after queueing"
        assert {status for status, _, _ in http} <= {200, 429, 503}, http[:20]
        unavailable = [hint for code, hint in grpc_answers if code == "UNAVAILABLE"]
        assert unavailable and all(hint == "1000" for hint in unavailable), grpc_answers[:20]
        assert "OK" in {code for code, _ in grpc_answers} and 200 in {s for s, _, _ in http}, "some were admitted"
        time.sleep(1.5)  # the queue drains: the mark lapses
        assert _http(front.http_url, "slow", "X", x)[0] == 200
        counted = _envoy_refusals(settings)
        metrics = _metrics(settings)
        assert f'tpserve_admission_refused_total{{model="slow"}} {counted}' in metrics, metrics
        assert counted >= len(refused) + len(unavailable)
        assert endpoints.read_state(settings.state_dir / "replica-0").pid == pid, "the server stayed up"
    finally:
        stop_stack(settings.state_dir)


def test_only_the_model_marked_over_its_budget_is_refused_on_either_protocol(served, tmp_path):
    settings = _serve(served.repo, tmp_path / "state", "a_model_not_served=5")  # the controller marks nothing here
    try:
        front = endpoints.read_state(settings.state_dir)
        region, stop = Region(admission_of(settings.state_dir), 0), threading.Event()

        def hold():  # digits_cnn over its budget, as its replica's supervisor would mark it
            while not stop.wait(0.05):
                region.mark("digits_cnn", time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 10**9, 9000)

        region.mark("digits_cnn", time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 10**9, 9000)
        marker = threading.Thread(target=hold)
        marker.start()
        x = np.random.rand(1, 1, 8, 8).astype(np.float32)
        try:
            with httpclient.InferenceServerClient(front.http_url) as client:
                tensor = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
                tensor.set_data_from_numpy(x)
                with pytest.raises(InferenceServerException, match="queue time is over its budget") as refused:
                    client.infer("digits_cnn", [tensor])
                assert refused.value.status() == "429"
            assert _http(front.http_url, "digits_cnn", "input", x, version="1")[:2] == (429, "1")
            with grpcclient.InferenceServerClient(front.grpc_url) as client:
                tensor = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
                tensor.set_data_from_numpy(x)
                with pytest.raises(InferenceServerException, match="queue time is over its budget") as refused:
                    client.infer("digits_cnn", [tensor])
                assert refused.value.status() == "StatusCode.UNAVAILABLE"
            ok = _http(front.http_url, "digits_cnn_int8", "input", x)
            assert ok[0] == 200, "another model is admitted meanwhile"
        finally:
            stop.set()
            marker.join()
        region.mark("digits_cnn", 0, 0)
        assert _http(front.http_url, "digits_cnn", "input", x)[0] == 200, "admitted once the mark is lifted"
        assert _envoy_refusals(settings) == 3
    finally:
        stop_stack(settings.state_dir)


@contextlib.contextmanager
def _in_server(tmp_path, *options: str):
    """The slow model served as `server start` serves it (the checks in the server) with options: its state folder
    and health port."""
    shutil.copytree(SLOW, tmp_path / "repo")
    ports = [str(p) for p in endpoints.free_ports(4)]
    state_dir = tmp_path / "state"
    command = [sys.executable, "-m", "tpserve.server", "start", *options,
               "--repo", str(tmp_path / "repo"), "--http-port", ports[0], "--grpc-port", ports[1],
               "--metrics-port", ports[2], "--health-port", ports[3], "--state-dir", str(state_dir)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    try:
        yield state_dir, int(ports[3])
    finally:
        subprocess.run([sys.executable, "-m", "tpserve.server", "stop", "--state-dir", str(state_dir)], timeout=120)


def _flood(state, seconds: float, http_threads: int = 6, grpc_threads: int = 10):
    """Both protocols at once on the slow model: (HTTP (status, retry-after, s)), (gRPC (code, pushback, s))."""
    x, deadline = np.ones((1, 1), np.float32), time.monotonic() + seconds

    def over_http(_):
        seen = []
        while time.monotonic() < deadline:
            seen.append(_http(state.http_url, "slow", "X", x))
        return seen

    def over_grpc(_):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(state.grpc_url))
        seen = []
        while time.monotonic() < deadline:
            started = time.monotonic()
            seen.append((*_grpc(stub, "slow", "X", x), time.monotonic() - started))
        return seen

    with concurrent.futures.ThreadPoolExecutor(http_threads + grpc_threads) as pool:
        http = [pool.submit(over_http, i) for i in range(http_threads)]
        grpc_answers = [pool.submit(over_grpc, i) for i in range(grpc_threads)]
        http, grpc_answers = [a for f in http for a in f.result()], [a for f in grpc_answers for a in f.result()]
    print(collections.Counter(s for s, _, _ in http), collections.Counter(c for c, _, _ in grpc_answers))
    return http, grpc_answers


def _refused_at_once(http, grpc_answers, status: int) -> tuple[int, int]:
    """Refusals on both protocols, each with its retry hint and in well under the model's quarter of a second, some
    calls admitted: how many of each."""
    turned = [took for code, hint, took in http if code == status and hint == "1"]
    assert turned and len(turned) == sum(code == status for code, _, _ in http), http[:20]
    assert sorted(turned)[len(turned) // 2] < 0.1, "refused at once, not after queueing"
    assert {code for code, _, _ in http} <= {200, status} and 200 in {c for c, _, _ in http}, http[:20]
    unavailable = [took for code, hint, took in grpc_answers if code == "UNAVAILABLE" and hint == "1000"]
    assert unavailable and len(unavailable) == sum(c == "UNAVAILABLE" for c, _, _ in grpc_answers), grpc_answers[:20]
    assert sorted(unavailable)[len(unavailable) // 2] < 0.1, "refused at once, not after queueing"
    assert {code for code, _, _ in grpc_answers} <= {"OK", "UNAVAILABLE"} and "OK" in {c for c, _, _ in grpc_answers}
    return len(turned), len(unavailable)


def _served_again(state) -> None:
    x = np.ones((1, 1), np.float32)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(state.grpc_url))
    assert _grpc(stub, "slow", "X", x)[0] == "OK" and _http(state.http_url, "slow", "X", x)[0] == 200


def test_calls_past_the_waiting_bound_are_refused_inside_tritonserver(tmp_path):
    """The default front: no Envoy to hold the bound, so the guard in tritonserver's reads refuses a new
    call once the server runs --max-waiting calls, HTTP and gRPC together: a gRPC call before gRPC has its message
    (server/triton/front/h2_admission.c), UNAVAILABLE with the retry hint; an HTTP request on its head
    (http_front.c), 503 with Retry-After. At once, the server never restarted, calls admitted again after. The flood
    outlasts the supervisor's 4 missed probes: its probes are never refused."""
    with _in_server(tmp_path, "--max-waiting", "4") as (state_dir, _):
        state = endpoints.read_state(state_dir)
        _refused_at_once(*_flood(state, seconds=8), status=503)
        time.sleep(1.5)
        _served_again(state)
        assert endpoints.read_state(state_dir).pid == state.pid, "the server stayed up"


def test_admission_by_queue_time_inside_tritonserver(tmp_path):
    """The default front with `--queue-slo-ms`: the supervisor marks the model over its budget in the admission
    table and the guard in tritonserver's reads refuses its new calls (HTTP 429, gRPC UNAVAILABLE, retry hints),
    counted where the supervisor's /metrics reads them; admitted again once the queue drains."""
    with _in_server(tmp_path, "--queue-slo-ms", "slow=100") as (state_dir, health_port):
        state = endpoints.read_state(state_dir)
        turned, unavailable = _refused_at_once(*_flood(state, seconds=8), status=429)
        time.sleep(1.5)  # the queue drains: the mark lapses
        _served_again(state)
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=5) as answer:
            metrics = answer.read().decode()
        counted = int(metrics.split('tpserve_admission_refused_total{model="slow"} ')[1].split()[0])
        probes = counted - (turned + unavailable)  # the supervisor's own probe inference (one each 10 s) is refused too
        assert 0 <= probes <= 2, metrics
        assert endpoints.read_state(state_dir).pid == state.pid, "the server stayed up"
