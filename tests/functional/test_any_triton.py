"""The measuring half against a Triton we did not build for: a hand-written repository with no manifest
(tests/fixtures/foreign_repo), reached by URL with no state folder. Every kind of model there is either
measured or skipped with the flag that fixes it; nothing crashes."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpserve.common import endpoints
from tpserve.server.triton import launcher

pytestmark = pytest.mark.functional
FIXTURE = Path(__file__).parents[1] / "fixtures" / "foreign_repo"
NO_STATE = ["--state-dir", "/nonexistent/state"]


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    root = tmp_path_factory.mktemp("foreign")
    shutil.copytree(FIXTURE, root / "repo")
    with launcher.running(root / "repo", root / "state") as state:
        yield state, root


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _perf(args: list[str], out: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`loadtest perf` at concurrency 1 with short, loose windows (a functional check, not a measurement)."""
    quick = ["--concurrency", "1", "--interval-ms", "300", "--stability", "100", "--out", str(out)]
    return _run(["tpserve.loadtest", "perf", *args, *quick], cwd, timeout=600)


def _key(state) -> list[str]:
    return ["--header", f"admin-key: {state.admin_headers()['admin-key']}"]


@pytest.mark.parametrize(
    "model, protocol, extra, expected",
    [
        ("add_sub", "http", [], "add_sub over http: 1 request"),
        ("add_sub", "grpc", [], "add_sub over grpc: 1 request"),
        ("scale_dynamic", "grpc", ["--shape", "X:5", "--batch", "2"], "Y: shape [2, 5]"),
        ("doubled", "http", ["--shape", "IN:3"], "OUT: shape [1, 3]"),
        ("repeat", "grpc", [], "response(s), first after"),
        ("accumulate", "http", ["--repeat", "3"], "one sequence of 3 requests"),
    ],
)
def test_infer_any_model_by_url(foreign, model, protocol, extra, expected):
    state, root = foreign
    url = state.http_url if protocol == "http" else state.grpc_url
    done = _run(["tpserve.clients", "infer", model, "--url", url, "--protocol", protocol, *extra, *NO_STATE], root)
    assert done.returncode == 0, done.stderr[-1500:]
    assert expected in done.stdout


@pytest.mark.parametrize(
    "model, args, message",
    [
        ("scale_dynamic", [], "--shape X:8"),
        ("byte_length", [], "--input-data"),
        ("repeat", ["--protocol", "http"], "gRPC streaming"),
    ],
)
def test_what_cannot_be_made_up_is_refused_with_the_flag(foreign, model, args, message):
    state, root = foreign
    url = state.grpc_url if "--protocol" not in args else state.http_url
    done = _run(["tpserve.clients", "infer", model, "--url", url, "--protocol", "grpc", *args, *NO_STATE], root)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


def test_bytes_from_the_users_data(foreign, tmp_path):
    state, root = foreign
    np.savez(tmp_path / "data.npz", PAYLOAD=np.array([[b"hello"], [b"four"]]))
    done = _run(
        [
            "tpserve.clients",
            "infer",
            "byte_length",
            "--url",
            state.http_url,
            "--input-data",
            str(tmp_path / "data.npz"),
            *NO_STATE,
        ],
        root,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    assert "LENGTH: shape [2, 1] dtype int32" in done.stdout


def test_perf_measures_every_ready_model_and_names_what_it_skips(foreign):
    state, root = foreign
    out = root / "perf"
    done = _perf(["--url", state.grpc_url, *_key(state), "--shape", "X:4", "--shape", "IN:4", *NO_STATE], out, root)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    measured = {
        line.split("|")[1].strip()
        for line in (out / "perf.md").read_text().splitlines()
        if line.startswith("| ") and "model" not in line
    }
    assert measured == {"accumulate", "add_sub", "doubled", "repeat", "scale_dynamic"}
    assert "byte_length" in json.loads((out / "skipped.json").read_text())
    report = (out / "report.md").read_text()
    assert "| add_sub | python | 0 | none | 1x KIND_CPU | no |" in report  # the server's own description
    assert "| repeat | python | 0 | none | 1x KIND_CPU | yes |" in report
    assert json.loads((out / "environment.json").read_text())["server"]["version"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_reads_a_restricted_statistics_api_with_the_key_from_a_file(foreign, protocol, tmp_path):
    state, root = foreign
    url = state.http_url if protocol == "http" else state.grpc_url
    base = ["--url", url, "--protocol", protocol, "--models", "add_sub", *NO_STATE]
    refused = _perf(base, tmp_path / "refused", root)
    assert refused.returncode != 0 and "--admin-key-file" in refused.stdout + refused.stderr
    key_file = tmp_path / "key"
    key_file.write_text(f"admin-key: {state.admin_headers()['admin-key']}\n")
    done = _perf([*base, "--admin-key-file", str(key_file)], tmp_path / "measured", root)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert "| add_sub |" in (tmp_path / "measured" / "perf.md").read_text()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_locust_drives_any_model_by_url(foreign, protocol):
    state, root = foreign
    url = state.http_url if protocol == "http" else state.grpc_url
    out = root / f"locust-{protocol}"
    models = "add_sub accumulate repeat doubled byte_length"
    done = _run(
        [
            "tpserve.loadtest",
            "locust",
            "--url",
            url,
            "--protocol",
            protocol,
            "--models",
            models,
            "--users",
            "5",
            "--spawn-rate",
            "5",
            "--shape",
            "IN:4",
            "--run-time",
            "4",
            "--out",
            str(out),
            *NO_STATE,
        ],
        root,
    )
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    skipped = json.loads((out / "skipped.json").read_text())
    assert "byte_length" in skipped and ("repeat" in skipped) == (protocol == "http")
    table = (out / "locust.md").read_text()
    assert "add_sub b1" in table and "accumulate b1" in table
    if protocol == "grpc":
        assert "repeat b1 first response" in table and "repeat b1 last response" in table
    assert not list(out.glob(".headers*"))


def test_search_edits_only_the_winners_config_of_a_repository_it_did_not_build(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    done = _run(
        [
            "tpserve.loadtest",
            "search",
            "--repo",
            str(repo),
            "--variants",
            "scale_dynamic",
            "--max-instances",
            "2",
            "--delays-us",
            "0 1000",
            "--interval-ms",
            "400",
            "--shape",
            "X:4",
            "--out",
            str(tmp_path / "out"),
        ],
        tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert "winner written to" in done.stdout
    after = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    changed = sorted(str(p.relative_to(repo)) for p in before if before[p] != after.get(p))
    assert changed in ([], ["scale_dynamic/config.pbtxt"]) and set(after) == set(before)


@pytest.fixture(scope="module")
def behind_tls(foreign, tmp_path_factory):
    """The foreign repository served by a replica behind Envoy that speaks TLS on HTTP and gRPC (a self-signed
    certificate for 127.0.0.1, made here with openssl)."""
    from tpserve.server.cluster import ClusterSettings, start_cluster
    from tpserve.server.stack import stop_stack

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    shutil.copytree(FIXTURE, root / "repo", ignore=shutil.ignore_patterns("__pycache__"))
    http_port, grpc_port, stats_port = endpoints.free_ports(3)
    settings = ClusterSettings(
        root / "repo",
        replicas=1,
        http_port=http_port,
        grpc_port=grpc_port,
        admin_port=stats_port,
        state_dir=root / "state",
        tls=(str(cert), str(key)),
    )
    start_cluster(settings)
    yield settings, cert, root
    stop_stack(settings.state_dir)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_and_perf_over_tls(behind_tls, protocol):
    settings, cert, root = behind_tls
    port = settings.http_port if protocol == "http" else settings.grpc_port
    tls = ["--url", f"127.0.0.1:{port}", "--protocol", protocol, "--tls", "--ca-file", str(cert), *NO_STATE]
    done = _run(["tpserve.clients", "infer", "add_sub", *tls], root)
    assert done.returncode == 0 and f"add_sub over {protocol}" in done.stdout, done.stderr[-1500:]
    plain = _run(["tpserve.clients", "infer", "add_sub", *tls[:4], *NO_STATE], root)
    assert plain.returncode != 0  # the listener speaks only TLS
    key = ["--header", f"admin-key: {(settings.state_dir / 'admin_key').read_text().strip()}"]
    out = root / f"perf-{protocol}"
    done = _perf(["--models", "add_sub", *key, *tls], out, root)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert "| add_sub |" in (out / "perf.md").read_text()
    done = _run(
        [
            "tpserve.loadtest",
            "locust",
            "--models",
            "add_sub",
            "--users",
            "2",
            "--spawn-rate",
            "2",
            "--run-time",
            "3",
            "--out",
            str(root / f"locust-{protocol}"),
            *tls,
        ],
        root,
    )
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert "add_sub b1" in (root / f"locust-{protocol}" / "locust.md").read_text()


def test_a_short_soak_of_a_server_we_did_not_start(foreign):
    state, root = foreign
    out = root / "soak"
    done = _run(
        [
            "tpserve.loadtest",
            "soak",
            "--model",
            "add_sub",
            "--minutes",
            "0.1",
            "--interval",
            "2",
            "--warmup",
            "1",
            "--url",
            state.grpc_url,
            "--protocols",
            "grpc",
            "--out",
            str(out),
            *NO_STATE,
        ],
        root,
    )
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    text = (out / "soak.md").read_text()
    assert "0 failed" in text and "not sampled: the server is not one we started" in text


def test_a_model_that_is_not_ready_is_listed_with_the_reason(tmp_path):
    import tritonclient.http as http

    shutil.copytree(FIXTURE, tmp_path / "repo", ignore=shutil.ignore_patterns("__pycache__"))
    options = {"model_control": "explicit", "extra_args": ("--load-model=*",)}
    with launcher.running(tmp_path / "repo", tmp_path / "state", **options) as state:
        with http.InferenceServerClient(state.http_url) as client:
            client.unload_model("byte_length", headers=state.admin_headers())
            _await_state(client, state, "byte_length", "UNAVAILABLE")
        out = tmp_path / "perf"
        args = ["--url", state.grpc_url, *_key(state), "--models", "", "--shape", "X:4", "--shape", "IN:4"]
        done = _perf([*args, *NO_STATE], out, tmp_path)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    skipped = json.loads((out / "skipped.json").read_text())
    assert skipped["byte_length"].startswith("not ready (UNAVAILABLE: unloaded)")
    assert "byte_length" in (out / "report.md").read_text()


def _await_state(client, state, model: str, wanted: str, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        index = client.get_model_repository_index(headers=state.admin_headers())
        if any(m["name"] == model and m.get("state") == wanted for m in index):
            return
        time.sleep(0.2)
    raise AssertionError(f"{model} never became {wanted}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_fast_replay_over_tls(behind_tls, protocol):
    """`replay --generator fast` against an endpoint we did not start, over TLS with the given roots: every
    request answered; without the roots, none is (the certificate is checked)."""
    from tpserve.common.traffic import RecordedInput, RecordedRequest, RecordingWriter

    settings, cert, root = behind_tls
    recording = root / f"recording-{protocol}"
    inputs = tuple(RecordedInput(name, "FP32", (4,)) for name in ("INPUT0", "INPUT1"))
    with RecordingWriter(recording) as writer:
        for i in range(30):
            writer.write(RecordedRequest(arrival_us=i * 20_000, model="add_sub", protocol=protocol, inputs=inputs))
    port = settings.http_port if protocol == "http" else settings.grpc_port
    target = ["--url", f"127.0.0.1:{port}", "--protocol", protocol, "--tls", *NO_STATE, "--generator", "fast"]
    for roots, answered in (["--ca-file", str(cert)], 30), ([], 0):
        out = root / f"replay-{protocol}-{answered}"
        done = _run(["tpserve.loadtest", "replay", "--from", str(recording), *target, *roots, "--out", str(out)], root)
        assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
        lines = [json.loads(line) for line in (out / "replay_results.jsonl").read_text().splitlines()[1:]]
        assert len(lines) == 30 and sum(line["status"] == "ok" for line in lines) == answered
