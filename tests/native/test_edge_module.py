"""The edge's checks module (tpserve/server/edge/checks_module.c), as Envoy drives it, under ASan/UBSan
(tests/native/edge_module_harness.c plays Envoy's side): over generated requests, each body cut into chunks handed
the ways Envoy hands them, the module's verdict is the C checks' own (tests/native/fuzz_checks.c calls them
directly): the same status, the same reading where it passes, the same reason where it refuses, as JSON. Where it
records, the traffic line names the path's model and version, and a passing request's inputs as the checks read
them, its body (base64) beside it. Hypothesis draws new requests each run (its seed is printed on a failure)."""

import base64
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.checks_cost import check_record
from tests.edge_requests import infer_request
from tests.native.c_checks import CChecks
from tests.native.test_native_fuzz import SANITIZERS
from tpserve.common.native_build import c_compiler
from tpserve.server.edge.request_checks import EdgeLimits, checks_json, model_rules

ROOT = Path(__file__).resolve().parents[2]
EDGE = ROOT / "tpserve" / "server" / "edge"
FRONT = ROOT / "tpserve" / "server" / "triton" / "front"
FIXTURE = ROOT / "tests" / "fixtures" / "edge_echo"
VALUE_BYTES = 2048
MODES = {"received": 0, "split": 1, "same": 2, "trailers": 3}


class Module:
    """The harness over the module, configured with the fixture's rules, echo and recording (values up to 2 KiB)."""

    def __init__(self, folder: Path, rules_json: str):
        compiler = c_compiler()
        if compiler is None:
            pytest.skip("no C compiler (cc/gcc): the edge's modules are built where Envoy runs")
        binary = folder / "edge_module_harness"
        sources = [ROOT / "tests" / "native" / "edge_module_harness.c", EDGE / "checks_module.c"]
        sources += [EDGE / "envoy_module.c", FRONT / "http_checks.c"]
        flags = ["-g", "-O1", "-Wall", "-Wextra", "-Werror", *SANITIZERS, f"-I{EDGE}", f"-I{FRONT}"]
        subprocess.run([compiler, *flags, "-o", str(binary), *map(str, sources), "-lm"], check=True)
        config = folder / "module.conf"
        config.write_text(f"echo 1\nrecord 1\nvalues 1\nvalue_bytes {VALUE_BYTES}\nrules\n{rules_json}")
        self.process = subprocess.Popen([str(binary), str(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def answer(self, method, path, body, headers, chunk, mode, replay) -> tuple[int, str, str, str, str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        record = check_record(method, path, body, headers)
        head, rest = record.split(b"\n", 1)
        self.process.stdin.write(head + f" {chunk} {MODES[mode]} {int(replay)}\n".encode() + rest)
        self.process.stdin.flush()
        line = self.process.stdout.readline().decode().rstrip("\n")
        if not line:
            raise AssertionError(f"the module's harness stopped (rc {self.process.poll()}): a sanitizer finding?")
        status, *fields = line.split("\t")
        return (int(status), *(bytes.fromhex(f).decode("utf-8", "replace") for f in fields))  # type: ignore[return-value]

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0, "the harness ended badly (a sanitizer finding?)"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    rules = checks_json(model_rules(FIXTURE), EdgeLimits())
    folder = tmp_path_factory.mktemp("edge_module")
    module, checks = Module(folder, rules), CChecks(folder, rules)
    yield module, checks
    module.close()
    checks.close()


def _same_verdict(pair, method, path, body, headers, chunk, mode, replay=False):
    module, checks = pair
    status, echo, line, values, refusal = module.answer(method, path, body, headers, chunk, mode, replay)
    verdict = checks.verdict(method, path, body, headers)
    assert status == verdict.status, (status, verdict, mode, chunk)
    if status == 0:
        assert echo == verdict.reading
    else:
        why = "".join(" " if ord(c) < 32 or c in '"\\\x7f' else c for c in verdict.why)
        assert json.loads(refusal) == {"error": why}
    return status, verdict, line, values


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    request=infer_request(),
    chunk=st.sampled_from([1, 3, 64, 1 << 20]),
    mode=st.sampled_from(sorted(MODES)),
    replay=st.booleans(),
)
def test_the_module_gives_the_checks_verdict_and_records_what_they_read(pair, request, chunk, mode, replay):
    status, verdict, line, values = _same_verdict(
        pair, "POST", request.path, request.body, request.headers, chunk, mode, replay
    )
    recorded = json.loads(line)
    assert recorded["model"] == "echo" and recorded["version"] == ""
    assert recorded.get("replayed", False) is replay
    if status:
        assert recorded["inputs"] == [] and recorded["batch"] == 1 and values == ""
        return
    read = [f"{name}:{datatype}:[{','.join(map(str, dims))}]" for name, datatype, dims in recorded["inputs"]]
    assert sorted(read) == verdict.view()
    if len(request.body) <= VALUE_BYTES:
        kept = json.loads(values)
        assert base64.b64decode(kept["body"]) == request.body
        declared = request.headers.get("Inference-Header-Content-Length")
        assert kept["header_length"] == (int(declared.strip(" \t")) if declared else 0)
    else:
        assert values == ""


@pytest.mark.parametrize(
    ("method", "path", "body", "model", "version"),
    [
        ("GET", "/v2/health/ready", b"", None, None),
        ("GET", "/v2/models/echo/versions/3/infer", b"", "echo", "3"),  # recorded though refused (405)
        ("POST", "/v2/models/echo/versions/12/infer", b'{"inputs":[]}', "echo", "12"),
        ("POST", "/v2/models/other/infer", b"{", "other", ""),
        ("DELETE", "/v2/models/echo", b"", None, None),
        ("POST", "/v2/repository/models/echo/load", b'{"parameters":{"file:1/model.py":"eA=="}}', None, None),
        ("POST", "/v2/models/e%63ho/infer", b"{}", None, None),
    ],
)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_other_paths_and_methods_get_the_checks_verdict_and_only_inference_is_recorded(
    pair, method, path, body, model, version, mode
):
    _, _, line, _ = _same_verdict(pair, method, path, body, {}, 2, mode)
    if model is None:
        assert line == ""
    else:
        assert (json.loads(line)["model"], json.loads(line)["version"]) == (model, version)
