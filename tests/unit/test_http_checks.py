"""The edge's HTTP request checks in C (tpserve/server/triton/front/http_checks.c), built with ASan/UBSan: every case
the edge's functional tests send (tests/functional/test_edge.py) gets the same verdict here, good requests pass with
the reading the edge reports, and a leak or a read past a buffer fails the run (CChecks.close)."""

import gzip
import json

import pytest

from tests.native.c_checks import CChecks
from tpserve.common.native_build import c_compiler
from tpserve.server.edge.request_checks import EdgeLimits, ModelRules, checks_json

DATA64 = ",".join(["0"] * 64)
INFER = "/v2/models/digits_cnn/infer"
RULES = {
    "digits_cnn": ModelRules(64, {"input": {"datatype": "FP32", "dims": [1, 8, 8]}}),
    "text": ModelRules(0, {"TEXT": {"datatype": "BYTES", "dims": [-1]}}),
    "modèle": ModelRules(4, {"entrée": {"datatype": "INT64", "dims": [3]}}),
}


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    if c_compiler() is None:
        pytest.skip("no C compiler (cc/gcc): the checks are built where the server runs")
    found = CChecks(tmp_path_factory.mktemp("checks"), checks_json(RULES, EdgeLimits()))
    yield found
    found.close()


def _body(shape: str, name: str = "input") -> str:
    return f'{{"inputs":[{{"name":"{name}",{shape},"datatype":"FP32","data":[{DATA64}]}}]}}'


def _inputs(*inputs) -> bytes:
    return json.dumps({"inputs": list(inputs)}).encode()


HUGE = [1, 1, 8, 2147483648]
REFUSED = {  # body -> status, a word of the reason
    "huge shape": (_inputs({"name": "input", "shape": HUGE, "datatype": "FP32", "data": [0] * 4}), 400, "dimension"),
    "huge shape, unknown model": (
        _inputs({"name": "x", "shape": [1, 2**30], "datatype": "FP64", "data": [0]}),
        400,
        "over the limit",
    ),
    "dims over the config": (
        _inputs({"name": "input", "shape": [1, 1, 8, 1000000], "datatype": "FP32", "data": [0]}),
        400,
        "the model takes [batch]+[1,8,8]",
    ),
    "fewer values": (
        _inputs({"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": [0]}),
        400,
        "holds 1",
    ),
    "batch over": (_inputs({"name": "input", "shape": [999, 1, 8, 8], "datatype": "FP32", "data": [0]}), 400, "1..64"),
    "negative dim": (_inputs({"name": "input", "shape": [1, -1, 8, 8], "datatype": "FP32", "data": [0]}), 400, "-1"),
    "wrong datatype": (
        _inputs({"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP64", "data": [0] * 64}),
        400,
        "takes FP32",
    ),
    "duplicate key": (
        '{"inputs":[{"name":"input","shape":[1,1,8,2147483648],"datatype":"FP32","shape":[1,1,8,8],'
        f'"data":[{DATA64}]}}]}}'.encode(),
        400,
        "appears twice",
    ),
    "escaped key": (
        f'{{"inputs":[{{"name":"input","sh\\u0061pe":[1,1,8,8],"datatype":"FP32","data":[{DATA64}]}}]}}'.encode(),
        400,
        "escape sequence in a key",
    ),
    "shape as a double": (_body('"shape":[1,1,8,8.0]').encode(), 400, "8.0"),
    "shape with an exponent": (_body('"shape":[1,1,8,8e0]').encode(), 400, "8e0"),
    "a number beyond a double": (
        ('{"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1e400' + ",0" * 63 + "]}]}").encode(),
        400,
        "unexpected '1e400",
    ),
    "an escaped NUL in a name": (_body('"shape":[1,1,8,8]', name="inp\\u0000ut").encode(), 400, "control character"),
    "deep nesting": (b"[" * 200_000, 400, "nested deeper than 32"),
    "parameter bomb": (
        ('{"parameters":{' + ",".join(f'"p{i}":{i}' for i in range(77_000)) + "}}").encode(),
        400,
        "more than 64 keys",
    ),
    "output bomb": (
        ('{"inputs":[],"outputs":[' + ",".join('{"name":"o"}' for _ in range(100_000)) + "]}").encode(),
        400,
        "more than 64 items",
    ),
    "text after the value": (_body('"shape":[1,1,8,8]').encode() + b" x", 400, "text after"),
    "trailing comma": (b'{"inputs":[],}', 400, "a key was expected"),
    "a comment": (b'{"inputs":[] /* x */}', 400, "expected"),
    "NaN outside data": (b'{"inputs":[{"name":"input","shape":[NaN]}]}', 400, "unexpected 'NaN"),
    "a lone surrogate": (_body('"shape":[1,1,8,8]', name="a\\udc00").encode(), 400, "lone low surrogate"),
    "an unknown key": (
        f'{{"inputs":[{{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[{DATA64}],"x":1}}]}}'.encode(),
        400,
        "unknown key 'x'",
    ),
    "a parameter that is an object": (b'{"parameters":{"a":{}},"inputs":[{"name":"i"}]}', 400, "parameter 'a'"),
    "the call id as a parameter": (
        ('{"parameters":{"X-Edge-Call":"00000000000000ab"},' + _body('"shape":[1,1,8,8]')[1:]).encode(),
        400,
        "the server's own",
    ),
    "a quoted NaN in FP32 data": (_body('"shape":[1,1,8,8]').replace("[0,", '["NaN",', 1).encode(), 400, "a string"),
    "null in FP32 data": (_body('"shape":[1,1,8,8]').replace("[0,", "[null,", 1).encode(), 400, "null in its FP32"),
    "true in FP32 data": (_body('"shape":[1,1,8,8]').replace("[0,", "[true,", 1).encode(), 400, "true or false"),
    "not JSON": (b"\x00\xff", 400, "unexpected"),
    "empty": (b"", 400, "a value was expected"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_request_that_cannot_be_valid_is_refused(checks, case):
    body, status, word = REFUSED[case]
    verdict = checks.verdict("POST", "/v2/models/other/infer" if "unknown model" in case else INFER, body)
    assert (verdict.status, verdict.reading) == (status, ""), verdict
    assert word in verdict.why, verdict.why


def test_good_requests_pass_with_the_reading_triton_makes(checks):
    verdict = checks.verdict("POST", INFER, _body('"shape":[1,1,8,8]').encode())
    assert (verdict.status, verdict.reading) == (0, "input:FP32:[1,1,8,8]:json 64"), verdict
    header = json.dumps({"inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 512}}]}).encode()  # fmt: skip
    binary = checks.verdict("POST", INFER, header + bytes(512), {"Inference-Header-Content-Length": str(len(header))})
    assert (binary.status, binary.reading) == (0, "input:FP32:[2,1,8,8]:binary 512"), binary
    short = checks.verdict("POST", INFER, header + bytes(511), {"Inference-Header-Content-Length": str(len(header))})
    assert short.status == 400 and "beyond the 511 bytes left" in short.why
    text = _inputs({"name": "TEXT", "shape": [2], "datatype": "BYTES", "data": ["h\u00e9", "\U0001f600"]})
    assert checks.verdict("POST", "/v2/models/text/versions/3/infer", text).reading == "TEXT:BYTES:[2]:json 2"
    named = '{"inputs":[{"name":"entr\\u00e9e","shape":[1,3],"datatype":"INT64","data":[1,2,3]}]}'.encode()
    assert checks.verdict("POST", "/v2/models/modèle/infer".encode().decode("latin-1"), named).status == 404
    shm = _inputs({"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                   "parameters": {"shared_memory_region": "mine", "shared_memory_byte_size": 256}})  # fmt: skip
    assert checks.verdict("POST", INFER, shm).reading == "input:FP32:[1,1,8,8]:shm mine"
    own = _inputs({"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0] * 64,
                   "parameters": {"x-edge-call": "00000000000000ab"}})  # fmt: skip
    assert checks.verdict("POST", INFER, own).status == 0  # a tensor's parameter: never the request's id
    unquoted = _body('"shape":[1,1,8,8]').replace("[0,0,0,", "[NaN,Infinity,-Infinity,", 1).encode()
    assert checks.verdict("POST", INFER, unquoted).status == 0  # tritonserver reads these as numbers


@pytest.mark.parametrize("length", ["0xa8", "1.68e2", "+168", "0168", " 168", "168,168", "1234567890"])
def test_an_inference_header_length_in_another_spelling_is_refused(checks, length):
    header = _inputs({"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32"})
    verdict = checks.verdict("POST", INFER, header, {"Inference-Header-Content-Length": length})
    assert verdict.status == 400 and "Inference-Header-Content-Length" in verdict.why, verdict


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("DELETE", "/v2/models/digits_cnn", 405),
        ("POST", "/v2/models/digits_cnn/config", 405),
        ("GET", "/v2/models/%64igits_cnn/ready", 400),
        ("POST", "/v2/repository/models/../load", 400),
        ("GET", "/v2/repository/other/index", 404),
        ("GET", "/v2/models/digits_cnn//ready", 404),
        ("POST", "/v2/models/digits_cnn/generate", 404),
        ("POST", "/v2/models/digits_cnn/generate_stream", 404),
        ("GET", "/v2/models/digits_cnn?x=1", 400),
        ("GET", "http://host/v2", 404),
        ("GET", "/v2/", 404),
        ("GET", "/v2", 0),
        ("GET", "/v2/models/stats", 0),
        ("GET", "/v2/models/digits_cnn/versions/1/ready", 0),
        ("GET", "/v2/models/digits_cnn/versions/x/ready", 404),
        ("GET", "/v2/systemsharedmemory/region/r/status", 0),
        ("POST", "/v2/logging", 0),
    ],
)
def test_methods_and_paths_outside_the_allowlist_are_refused(checks, method, path, status):
    assert checks.verdict(method, path).status == status


def test_an_encoded_body_gets_415(checks):
    body = gzip.compress(_body('"shape":[1,1,8,8]').encode())
    verdict = checks.verdict("POST", INFER, body, {"Content-Encoding": "gzip"})
    assert verdict.status == 415 and "send the body uncompressed" in verdict.why
    assert (
        checks.verdict("POST", INFER, _body('"shape":[1,1,8,8]').encode(), {"Content-Encoding": "identity"}).status == 0
    )


LOAD = "/v2/repository/models/digits_cnn/load"


@pytest.mark.parametrize("key", ["backend", "parameters", "model_warmup", "runtime", "platform"])
def test_a_config_override_cannot_name_code_or_files(checks, key):
    body = json.dumps({"parameters": {"config": json.dumps({"name": "digits_cnn", key: "x"})}}).encode()
    verdict = checks.verdict("POST", LOAD, body)
    assert verdict.status == 403 and key in verdict.why


@pytest.mark.parametrize(("filename", "status"), [("../x.py", 403), ("a/b.py", 403), ("..", 403), ("model.py", 0)])
def test_a_config_override_stays_in_the_model_folder(checks, filename, status):
    config = json.dumps({"name": "digits_cnn", "default_model_filename": filename})
    assert checks.verdict("POST", LOAD, json.dumps({"parameters": {"config": config}}).encode()).status == status


def test_a_load_carrying_files_or_the_backends_memory_is_refused(checks):
    files = json.dumps({"parameters": {"file:1/model.py": "aGk="}}).encode()
    assert checks.verdict("POST", LOAD, files).status == 403
    assert checks.verdict("POST", LOAD, b"").status == 0
    for name in ("triton_python_backend_shm_region_1", "//triton_python_backend_x"):
        body = json.dumps({"key": name, "offset": 0, "byte_size": 64}).encode()
        assert checks.verdict("POST", "/v2/systemsharedmemory/region/r/register", body).status == 403
    mine = json.dumps({"key": "/mine", "offset": 0, "byte_size": 64}).encode()
    assert checks.verdict("POST", "/v2/systemsharedmemory/region/r/register", mine).status == 0
