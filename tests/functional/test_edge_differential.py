"""The edge reads a request exactly as tritonserver does: a differential test over generated requests.

Every request goes through the edge (Envoy + its checks' module, server/edge/checks_module.c over
server/triton/front/http_checks.c, echo_reading on) to a real tritonserver serving tests/fixtures/edge_echo (a model
that answers with what Triton read of each input). For every body the edge passes and Triton serves, the names,
datatypes and shapes Triton read must be those the edge checked; no request may take the server down (no 5xx, same
pid). The same C called directly (under ASan/UBSan) must give every request the module's verdict in Envoy: the same
status, and where it passes, the same reading (what Envoy hands the module is what the checks read). `make fuzz-edge`
runs the same property longer, with random seeds, and writes docs/security/edge_fuzz.md.
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.edge_requests import infer_request
from tests.functional.conftest import behind_edge
from tests.native.c_checks import CChecks
from tpserve.common import endpoints
from tpserve.common.native_build import c_compiler
from tpserve.server.edge.request_checks import EdgeLimits, checks_json, model_rules
from tpserve.server.single import start_single
from tpserve.server.stack import stop_stack

pytestmark = pytest.mark.functional
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "edge_echo"
EXAMPLES = int(os.environ.get("EDGE_FUZZ_EXAMPLES", "1500"))
RANDOM = os.environ.get("EDGE_FUZZ_RANDOM") == "1"  # make fuzz-edge: new seeds each run
OUTCOMES: Counter = Counter()
SAMPLES: dict = {}  # outcome -> a few requests that had it (for the report)


@pytest.fixture(scope="module")
def echo_edge(tmp_path_factory):
    root = tmp_path_factory.mktemp("edge_echo")
    shutil.copytree(FIXTURE, root / "repo")
    cluster = behind_edge(root / "repo", root / "state", echo_reading=True)
    start_single(cluster)
    yield cluster
    stop_stack(cluster.state_dir)


@pytest.fixture(scope="module")
def c_checks(tmp_path_factory):
    """The C checks under the rules the edge serves with, or None where no C compiler is (the edge alone)."""
    if c_compiler() is None:
        yield None
        return
    checks = CChecks(tmp_path_factory.mktemp("c_checks"), checks_json(model_rules(FIXTURE), EdgeLimits()))
    yield checks
    checks.close()


@pytest.fixture(scope="module")
def checked_echo(tmp_path_factory):
    """tests/fixtures/edge_echo served with the edge's checks inside tritonserver (`start --no-edge
    --checks-in-server`): its state."""
    if c_compiler() is None:
        pytest.skip("no C compiler (cc/gcc): the checks in tritonserver are built where it serves")
    root = tmp_path_factory.mktemp("checked_echo")
    shutil.copytree(FIXTURE, root / "repo")
    ports = [str(p) for p in endpoints.free_ports(4)]
    command = [sys.executable, "-m", "tpserve.server", "start", "--no-edge", "--checks-in-server", "--grpc-streaming",
               "--repo", str(root / "repo"), "--http-port", ports[0], "--grpc-port", ports[1],
               "--metrics-port", ports[2], "--health-port", ports[3], "--state-dir", str(root / "state")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    yield endpoints.read_state(root / "state"), root / "state"
    subprocess.run([sys.executable, "-m", "tpserve.server", "stop", "--state-dir", str(root / "state")], timeout=120)


class Edge:
    """One keep-alive connection to the edge, opened again when a response closed it."""

    def __init__(self, port: int):
        self.port, self.conn = port, None

    def send(self, request) -> tuple[int, dict, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.request("POST", request.path, body=request.body, headers=request.headers)
                answer = self.conn.getresponse()
                return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def edge_view(header: str) -> list[str]:
    """'A:FP32:[1,2]:json 2;B:...' -> ['A:FP32:[1,2]', ...], sorted."""
    return sorted(":".join(part.split(":")[:3]) for part in header.split(";") if part)


def triton_view(body: bytes) -> list[str]:
    outputs = json.loads(body)["outputs"]
    return sorted(p for p in outputs[0]["data"][0].split(";") if p)


def check(edge: Edge, request, c_checks: CChecks | None = None) -> str:
    """Send request; assert the property; return the outcome's name."""
    status, headers, body = edge.send(request)
    assert status < 500, f"{status} {body[:300]!r} for {request.meant!r}: the server failed or went away"
    refused = headers.get("x-edge") == "refused"
    if c_checks is not None:
        verdict = c_checks.verdict("POST", request.path, request.body, request.headers)
        assert verdict.status == (status if refused else 0), (verdict, status, body[:300], request.meant)
        assert refused or verdict.view() == edge_view(headers.get("x-edge-read", "")), (verdict, request.meant)
    if refused:
        assert 400 <= status < 500 and b"error" in body
        return "refused by the edge"
    if status != 200:
        return f"passed the edge, refused by Triton ({status})"
    assert edge_view(headers.get("x-edge-read", "")) == triton_view(body), request.meant
    return "served: Triton read what the edge checked"


def test_triton_reads_what_the_edge_checked(echo_edge, c_checks):
    pid = endpoints.read_state(echo_edge.state_dir / "replica-0").pid
    edge = Edge(echo_edge.http_port)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(infer_request())
    def property_holds(request):
        outcome = check(edge, request, c_checks)
        OUTCOMES[outcome] += 1
        if len(SAMPLES.setdefault(outcome, [])) < 5:
            SAMPLES[outcome].append(request.meant)

    property_holds()
    assert endpoints.read_state(echo_edge.state_dir / "replica-0").pid == pid, "tritonserver was restarted"
    print(f"\nedge differential, {EXAMPLES} requests: {dict(OUTCOMES)}")
    report = os.environ.get("EDGE_FUZZ_REPORT")
    if report:
        Path(report).write_text(fuzz_report(EXAMPLES, RANDOM, OUTCOMES, SAMPLES))
    assert OUTCOMES["served: Triton read what the edge checked"] > EXAMPLES // 10, OUTCOMES  # the test reaches Triton


def test_triton_reads_what_the_checks_inside_it_checked(checked_echo, c_checks):
    """The same requests to tritonserver's own HTTP port, checked inside its reads: each gets the C checks' verdict
    (the same status where refused), and where Triton serves one, it read what the checks read."""
    state, state_dir = checked_echo
    server = Edge(state.http_port)
    outcomes: Counter = Counter()

    @settings(
        max_examples=max(EXAMPLES // 3, 100),
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(infer_request())
    def property_holds(request):
        status, headers, body = server.send(request)
        assert status < 500, f"{status} {body[:300]!r} for {request.meant!r}: the server failed or went away"
        verdict = c_checks.verdict("POST", request.path, request.body, request.headers)
        refused = headers.get("x-edge") == "refused"
        assert refused == (verdict.status != 0) and (not refused or status == verdict.status), (verdict, status)
        if status == 200:
            assert verdict.view() == triton_view(body), (verdict, request.meant)
        outcomes["refused in the server's reads" if refused else f"reached Triton ({status})"] += 1

    property_holds()
    assert endpoints.read_state(state_dir).pid == state.pid, "tritonserver was restarted"
    print(f"\nchecks in the server, {sum(outcomes.values())} requests: {dict(outcomes)}")
    assert outcomes["reached Triton (200)"] > 10, outcomes  # the test reaches Triton


def fuzz_report(examples: int, random: bool, outcomes: Counter, samples: dict) -> str:
    """docs/security/edge_fuzz.md: the run's count, outcomes and a few requests of each outcome."""
    import time

    lines = [
        "# The edge's differential test: a long run",
        "",
        f"`make fuzz-edge FUZZ_EXAMPLES={examples}` on {time.strftime('%Y-%m-%d')} "
        f"({'new random seeds' if random else 'fixed seeds'}): generated inference requests through the edge "
        "(Envoy + its checks' module over server/triton/front/http_checks.c) to a real tritonserver 2.51 serving "
        "tests/fixtures/edge_echo. Property: for every body the edge passes and Triton serves, Triton read the names, "
        "datatypes and shapes the edge checked; no request got a 5xx; the server's pid never changed. "
        "**Findings: none in this run** (a finding fails the run).",
        "",
        "| outcome | requests |",
        "|---|---:|",
        *(f"| {name} | {count:,} |" for name, count in sorted(outcomes.items())),
        "",
        "A few requests of each outcome (the JSON part, cut at 300 characters):",
        "",
    ]
    for name, found in sorted(samples.items()):
        lines += [f"**{name}**", "", *(f"- `{s[:300]!r}`" for s in found[:3]), ""]
    return "\n".join(lines)


def test_grpc_calls_of_any_size_and_streams_pass_the_guard_uncut(checked_echo):
    """Real gRPC clients on the guarded public gRPC port: a 16 MiB tensor (past every window the server first
    announces, so the server's WINDOW_UPDATEs must be followed), a call with a deadline, and a ModelStreamInfer stream
    of several requests are all answered, and the guard cut no connection."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    state, state_dir = checked_echo
    big = np.ones((1024, 4096), np.float32)
    with grpcclient.InferenceServerClient(state.grpc_url) as client:
        tensor = grpcclient.InferInput("A", list(big.shape), "FP32")
        tensor.set_data_from_numpy(big)
        for _ in range(3):
            assert client.infer("echo", [tensor]).as_numpy("READ")[0] == b"A:FP32:[1024,4096]"
        assert client.infer("echo", [tensor], client_timeout=60).as_numpy("READ")[0] == b"A:FP32:[1024,4096]"
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        small = grpcclient.InferInput("A", [1, 4], "FP32")
        small.set_data_from_numpy(np.ones((1, 4), np.float32))
        for _ in range(5):
            client.async_stream_infer("echo", [small])
        got = [answers.get(timeout=60) for _ in range(5)]
        client.stop_stream()
    assert all(g.as_numpy("READ")[0] == b"A:FP32:[1,4]" for g in got), got
    log = (state_dir / "tritonserver.log").read_text(errors="replace")
    assert "a gRPC client sent a frame" not in log
