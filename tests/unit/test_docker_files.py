"""Static validation of the NGC Docker files (no Docker engine runs here)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tpserve.server.triton.launcher import RESTRICTED

DOCKER = Path(__file__).parents[2] / "docker"
BIN = Path(sys.executable).parent


def _run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True)


def _compose():
    return YAML(typ="safe").load((DOCKER / "compose.yaml").read_text())


def test_dockerfile_passes_hadolint_and_a_bad_one_does_not(tmp_path):
    assert _run(BIN / "hadolint", DOCKER / "Dockerfile.builder").returncode == 0
    assert _run(BIN / "hadolint", DOCKER / "Dockerfile.server").returncode == 0
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install -y curl\nRUN cd /tmp\n")
    assert _run(BIN / "hadolint", bad).returncode != 0


def test_compose_file_matches_the_compose_schema_and_a_broken_one_does_not(tmp_path):
    schema = ["--builtin-schema", "vendor.compose-spec"]
    assert _run(BIN / "check-jsonschema", *schema, DOCKER / "compose.yaml").returncode == 0
    broken = tmp_path / "compose.yaml"
    broken.write_text((DOCKER / "compose.yaml").read_text().replace("shm_size: 1gb", "shm_size: [1gb]"))
    assert _run(BIN / "check-jsonschema", *schema, broken).returncode != 0


def test_one_release_variable_pins_every_image():
    compose = _compose()
    images = [s["image"] for s in compose["services"].values() if "image" in s]
    assert all("${NGC_RELEASE" in image for image in images)
    builds = [s["build"]["args"]["NGC_RELEASE"] for s in compose["services"].values() if "build" in s]
    assert builds and all(arg.startswith("${NGC_RELEASE") for arg in builds)
    assert "ARG NGC_RELEASE" in (DOCKER / "Dockerfile.builder").read_text()
    assert "ARG NGC_RELEASE" in (DOCKER / "Dockerfile.server").read_text()
    release = re.search(r"^NGC_RELEASE=(\d+)\.(\d+)$", (DOCKER / ".env").read_text(), re.M)
    assert release and (int(release[1]), int(release[2])) >= (25, 8)  # fixes for the 2025 CVEs


def test_server_is_locked_down_like_the_embedded_one():
    server = _compose()["services"]["tritonserver"]
    assert all(p.startswith("127.0.0.1:") for p in server["ports"])
    (volume,) = server["volumes"]
    assert volume["target"] == "/models" and volume["read_only"] is True
    assert "--model-control-mode=none" in server["command"]
    assert server["secrets"] == ["triton_admin_key"] and server["build"]["target"] == "server"
    text = (DOCKER / "compose.yaml").read_text()
    assert "admin-key=" not in text and "TRITON_ADMIN_KEY" not in text  # no key on a command line or in env
    script = (DOCKER / "serve.sh").read_text()
    assert f'restricted="{",".join(RESTRICTED)}:admin-key=@TRITON_ADMIN_KEY@"' in script
    assert '--http-restricted-api="$restricted" --grpc-restricted-protocol="$restricted"' in script
    assert server["shm_size"] and server["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_serve_docker_runs_the_guard_before_starting_the_server():
    done = _run("make", "-n", "-C", DOCKER.parent, "serve-docker", "REPO=model_repository", "NGC_HERE=1")
    lines = [line for line in done.stdout.splitlines() if "builders guard" in line or "compose" in line]
    assert "builders guard" in lines[0] and "--image nvcr.io/nvidia/tritonserver:" in lines[0]
    assert "up -d --build --wait tritonserver" in lines[1] and "ADMIN_KEY_FILE=" in lines[1]
    assert "from tpserve.server.triton.launcher import admin_key" in lines[1]  # the key file's path, not the key


def test_serve_docker_without_a_gpu_and_the_ngc_image_serves_our_image():
    done = _run("make", "-n", "-C", DOCKER.parent, "serve-docker", "REPO=model_repository", "NGC_HERE=")
    (line,) = [line for line in done.stdout.splitlines() if "container-start" in line]
    assert "--repo model_repository" in line and "--health-port" in line and "--state-dir" in line
    assert "compose" not in done.stdout


def test_the_images_shim_is_compiled_from_every_source_the_embedded_one_is(tmp_path):
    """docker/Dockerfile.server compiles the shim as `make install` does (preloads.SOURCES), and the command it runs
    links here with no symbol left undefined (-z defs): a source left out fails the image's build, not its start."""
    import shlex
    import shutil

    from tpserve.common.native_build import c_compiler
    from tpserve.server.triton.preloads import SOURCES

    text = (DOCKER / "Dockerfile.server").read_text().replace("\\\n", " ")
    (command,) = [line.split("RUN ", 1)[1] for line in text.splitlines() if line.startswith("RUN gcc")]
    triton = SOURCES[0].parent  # /src/triton/ in the image; its shell expands front/*.c as this does

    def expanded(word: str) -> list[str]:
        if "*" not in word:
            return [word]
        return sorted(f"/src/triton/{p.relative_to(triton)}" for p in triton.glob(word.removeprefix("/src/triton/")))

    words = [x for w in shlex.split(command) for x in expanded(w)]
    compiled = sorted(w.removeprefix("/src/triton/") for w in words if w.endswith(".c"))
    assert compiled == sorted(p.relative_to(triton).as_posix() for p in SOURCES)
    compiler = c_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc) here to run the image's compile")
    shutil.copytree(SOURCES[0].parent, tmp_path / "src" / "triton")
    (tmp_path / "src" / "edge").mkdir()
    shutil.copy(SOURCES[0].parent.parent / "edge" / "admission_parse.h", tmp_path / "src" / "edge")
    words = [compiler if w == "gcc" else w.replace("/src/", f"{tmp_path}/src/") for w in words]
    done = subprocess.run(words, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
