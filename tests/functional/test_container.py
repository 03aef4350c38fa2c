"""Triton in a container on a host without a GPU: the server image (docker/Dockerfile.embedded) built with the
engine here, no unnamed image left behind, the zoo's digits_cnn (a repository of whoever built it, root included)
served from it with the default front as `make serve` serves, answered over HTTP and gRPC from the host, a
tritonserver killed inside restarted by the supervisor, and a clean stop that gives the state folder back. Skips
with the reason only where no container engine can run."""

import json
import os
import subprocess
import time
import urllib.request

import numpy as np
import pytest

from tests.functional.conftest import endpoint_of
from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.clients.infer import infer
from tpserve.common import endpoints
from tpserve.server import container

pytestmark = pytest.mark.functional

WHY_NOT = container.no_engine_reason()
ZOMBIES = (  # run inside the container (no procps there): how many of its processes are zombies
    "import glob; print(sum(open(p).read().split(')')[-1].split()[0] == 'Z' for p in glob.glob('/proc/[0-9]*/stat')))"
)


@pytest.fixture(scope="module")
def image():
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    tag = container.build_image()
    assert container.dangling(container.engine()) == [], "the build left unnamed images of ours"
    return tag


@pytest.fixture
def repo(tmp_path, digits_build):
    spec, built, _ = digits_build
    repo = tmp_path / "repo"
    old = os.umask(0o022)  # as `make build-engines` writes it under the default umask (this process may have 077)
    try:
        build_model(BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=tmp_path / "work"), built)
    finally:
        os.umask(old)
    return repo  # this user's (root's, as in most CI): the container reads it as its own user


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _health(found, name: str) -> str:
    """The container's health as the engine reports it, once it has left "starting" (or after 120 s)."""
    deadline = time.monotonic() + 120
    while True:
        health = found.run("inspect", "--format", "{{.State.Health.Status}}", name, check=False).stdout.strip()
        if health != "starting" or time.monotonic() > deadline:
            return health
        time.sleep(1)


def _scraped(state_dir) -> bool:
    """Whether a Prometheus started on the state folder (make monitor) sees its target up."""
    import json
    import sys

    port = endpoints.free_ports(1)[0]
    prometheus = [sys.executable, "-m", "tpserve.loadtest", "prometheus"]
    start = [*prometheus, "start", "--state-dir", str(state_dir), "--port", str(port), "--interval", "1s"]
    subprocess.run(start, check=True, capture_output=True, timeout=120)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            query = f"http://127.0.0.1:{port}/api/v1/query?query=up"
            with urllib.request.urlopen(query, timeout=5) as answer:
                found = json.loads(answer.read())["data"]["result"]
            if found and all(r["value"][1] == "1" for r in found):
                return True
            time.sleep(1)
        return False
    finally:
        subprocess.run([*prometheus, "stop", "--state-dir", str(state_dir)], capture_output=True, timeout=60)


def test_the_image_serves_digits_with_the_default_front_survives_a_kill_and_stops_cleanly(image, repo, tmp_path):
    ports = endpoints.free_ports(4)
    state_dir = tmp_path / "state"
    serve = container.ContainerServe(repo, state_dir, *ports, image=image)
    found = container.engine()
    try:
        state = container.start(serve)
        name = container.record(state_dir)["name"]
        image_input = {"input": np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)}
        for protocol in ("http", "grpc"):
            answer = infer(endpoint_of(state, repo, protocol), "digits_cnn", image_input)
            assert answer.outputs["logits"].shape == (2, 10)
        assert _scraped(state_dir), "Prometheus on the host scrapes the container's metrics, as make monitor does"
        if found.name == "podman":  # the image's HEALTHCHECK (podman runs it on demand without systemd's timers)
            assert found.run("healthcheck", "run", name, check=False).returncode == 0
        else:  # Docker's daemon runs it on its own interval
            assert _health(found, name) == "healthy"
        assert "Started GRPCInferenceService" in found.run("logs", name).stdout  # the server's logs on stdout
        user = found.run("inspect", "--format", "{{.Config.User}}", name).stdout.strip()
        assert user == f"{container.UID}:{container.UID}", user  # the image's user, the repository being root's
        status, body = _oversized(state)
        assert status == 413 and "error" in json.loads(body), body  # the front's JSON answer, as `make serve` gives
        assert not (state_dir / "replica-0").exists(), "the default front: no Envoy, no replica folder"
        kill = f"import os; os.kill({state.pid}, 9)"  # tritonserver, inside the container (no procps there)
        found.run("exec", name, "python3", "-c", kill)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "restarted" not in (state_dir / "supervisor.log").read_text():
            time.sleep(0.5)
        while time.monotonic() < deadline and not _ready(ports[3]):
            time.sleep(0.5)
        assert infer(endpoint_of(state, repo, "grpc"), "digits_cnn", image_input).outputs["logits"].shape == (2, 10)
        zombies = ZOMBIES
        while time.monotonic() < deadline and found.run("exec", name, "python3", "-c", zombies).stdout.strip() != "0":
            time.sleep(0.5)  # the stubs of the killed server, orphaned: reaped by the container's first process
        assert found.run("exec", name, "python3", "-c", zombies).stdout.strip() == "0"
        shared = [str(p) for p in state_dir.rglob("*") if p.stat().st_mode & 0o077 and not p.is_symlink()]
        assert shared == [], "files or folders other users can read"
    finally:
        said = container.stop(state_dir)
    assert "stopped and removed" in said
    left = found.run("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert name not in left
    logs = (state_dir / "supervisor.log").read_text()
    assert "stopping: not ready" in logs and logs.rstrip().endswith("stopped")  # the supervisor's own clean stop
    assert not _ready(ports[3])
    others = [str(p) for p in [state_dir, *state_dir.rglob("*")] if p.lstat().st_uid != os.geteuid()]
    assert others == [], "the state folder was given back whole: the next `make serve` takes it"


def _oversized(state) -> tuple[int, str]:
    """A body declared larger than the front's cap (64 MB): refused from its head with 413 and why."""
    import http.client

    conn = http.client.HTTPConnection(state.host, state.http_port, timeout=60)
    try:
        conn.putrequest("POST", "/v2/models/digits_cnn/infer")
        conn.putheader("Content-Length", str(100 * 2**20))
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        conn.close()


def test_a_repository_the_container_cannot_read_is_refused_with_how_to_fix_it(tmp_path):
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    (tmp_path / "repo" / "model").mkdir(parents=True)
    (tmp_path / "repo" / "model").chmod(0o700)
    serve = container.ContainerServe(tmp_path / "repo", tmp_path / "state", *endpoints.free_ports(4))
    with pytest.raises(Exception, match=r"cannot be read by the container's user .*chmod -R o\+rX"):
        container.start(serve)
    assert not (tmp_path / "state" / container.RECORD).exists()


def test_make_status_lists_its_models_and_make_stop_stops_the_container_not_a_host_pid(image, repo, tmp_path):
    ports = endpoints.free_ports(4)
    state_dir = tmp_path / "state"
    container.start(container.ContainerServe(repo, state_dir, *ports, image=image))
    try:
        status = subprocess.run(
            ["make", "-s", "status", f"STATE_DIR={state_dir}"], capture_output=True, text=True, timeout=120
        )
        said = status.stdout + status.stderr
        assert "in the container" in status.stdout and "digits_cnn v1 READY" in status.stdout, said
        done = subprocess.run(
            ["make", "-s", "stop", f"STATE_DIR={state_dir}"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=os.getcwd(),
        )
    finally:
        container.stop(state_dir)  # whatever failed above: no container left behind
    assert "stopped and removed" in done.stdout, done.stdout + done.stderr
    assert container.record(state_dir) is None and not _ready(ports[3])
