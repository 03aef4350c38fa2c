"""Triton in a container on hosts without a GPU or the NGC registry: the image (`make image`), and a repository
served from it (`make serve-docker`, `make stop-docker`) so that every host-side tool measures it as it measures
`make serve`.

The image (docker/Dockerfile.embedded) is built from a context under .tools/image: the serve set's wheels,
downloaded once (again when the requirements change), and this project's wheel, made at each build (a code change
rebuilds the last layers only). Its base is BASE_IMAGE where one is given, else a Debian 12 made here from Debian's
packages (debootstrap; root), once. The container runs with the host's network, so the edge's ports are the
host's loopback ports as with `make serve`, with the default front (the same checks, answers and bounds); as the
image's own user (uid 10001, never root) whoever owns the repository, which is mounted read-only; the state folder
is lent to that user while it serves (mounted at the same path, so the state records, the admin key file, never an
argument or a variable, and the logs are where the host's tools look for them) and given back at stop.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import ServerError
from tpserve.common.wheel import project_wheel
from tpserve.paths import CHECKOUT, TOOLS

IMAGE = "localhost/tpserve-server:latest"
BASE_IMAGE = "localhost/tpserve-base:bookworm"
DOCKERFILE = CHECKOUT / "docker" / "Dockerfile.embedded"
REQUIREMENTS = CHECKOUT / "docker" / "serve-requirements.txt"
CONSTRAINTS = CHECKOUT / "constraints.txt"
PODMAN_CONF = CHECKOUT / "docker" / "containers.conf"
CONTEXT = TOOLS / "image"
RECORD = "container.json"
UID = 10001  # the image's own user: the container serves as it, whoever owns the repository
LABEL = "org.tpserve.image=server"  # on every stage of the image (docker/Dockerfile.embedded)


@dataclass(frozen=True)
class Engine:
    """A container engine that answers: its program and the environment it runs with."""

    name: str  # "podman" or "docker"
    env: dict

    def run(self, *args, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [self.name, *args], env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs
        )
        if check and done.returncode != 0:
            raise ServerError(f"{self.name} {args[0]} failed: {(done.stderr or done.stdout).strip()[-1500:]}")
        return done

    def has_image(self, tag: str) -> bool:
        return self.run("image", "inspect", tag, check=False).returncode == 0


def engine() -> Engine:
    """podman or docker, whichever answers (podman with this project's containers.conf unless one is set);
    TPSERVE_CONTAINER_ENGINE=docker or podman takes that one only.

    Raises:
        ServerError: neither runs here (the message says how to get one), or the one asked for does not.
    """
    env = dict(os.environ)
    asked = env.get("TPSERVE_CONTAINER_ENGINE", "").strip().lower()
    if asked not in ("", "podman", "docker"):
        raise ServerError(f"TPSERVE_CONTAINER_ENGINE={asked!r}: use podman or docker, or unset it to take either")
    if asked != "docker" and shutil.which("podman"):
        podman = {**env, "CONTAINERS_CONF": env.get("CONTAINERS_CONF", str(PODMAN_CONF))}
        if subprocess.run(["podman", "info"], env=podman, capture_output=True, timeout=60).returncode == 0:
            return Engine("podman", podman)
    if asked != "podman" and _docker_answers():
        return Engine("docker", env)
    if asked:
        raise ServerError(f"TPSERVE_CONTAINER_ENGINE={asked}, but `{asked} info` does not answer here")
    raise ServerError(
        "no container engine runs here: install Docker, or podman (`make container-engine` installs Debian's "
        "podman, runc and debootstrap; it needs root)"
    )


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def no_engine_reason() -> str | None:
    """Why no container can run here (None: one can)."""
    try:
        engine()
    except ServerError as err:
        return str(err)
    return None


def build_image(base_image: str = "", tag: str = IMAGE) -> str:
    """Build the server image (layers cached by the engine); returns its tag."""
    found = engine()
    base = base_image or BASE_IMAGE
    if not found.has_image(base):
        if base_image:
            step(f"image: pulling {base_image}")
            found.run("pull", base_image, timeout=1800)
        else:
            make_base(found)
    context = _context()
    step(f"image: building {tag} from {base} ({found.name})")
    command = ["build", "--network", "host", "-f", str(DOCKERFILE), "--build-arg", f"BASE_IMAGE={base}", "-t", tag]
    command += ["--format", "docker"] if found.name == "podman" else []  # OCI images drop the HEALTHCHECK
    done = subprocess.run([found.name, *command, str(context)], env=found.env, timeout=3600)
    if done.returncode != 0:
        raise ServerError(f"{found.name} build failed (exit {done.returncode}); its output is above")
    # the build stage's image and the image this tag named before: unnamed now, and ours by the label
    found.run("image", "prune", "-f", "--filter", f"label={LABEL}", check=False)
    size = found.run("image", "inspect", "--format", "{{.Size}}", tag, check=False).stdout.strip()
    if size.isdigit():
        step(f"image: {tag}, {int(size) / 1e9:.2f} GB")
    return tag


def dangling(found: Engine) -> list[str]:
    """Unnamed images our builds left (none after build_image)."""
    done = found.run("images", "-q", "--filter", "dangling=true", "--filter", f"label={LABEL}", check=False)
    return done.stdout.split()


def make_base(found: Engine) -> None:
    """BASE_IMAGE from Debian's packages: debootstrap's minimal Debian 12, imported (needs root and debootstrap)."""
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise ServerError(
            f"no base image {BASE_IMAGE}: give one (BASE_IMAGE=python:3.11-slim-bookworm where a registry is "
            "reachable), or make it from Debian's packages as root with debootstrap (`make container-engine`)"
        )
    CONTEXT.mkdir(mode=0o700, parents=True, exist_ok=True)
    rootfs = CONTEXT / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    step(f"image: making {BASE_IMAGE} from Debian's packages (debootstrap, about a minute)")
    try:
        made = subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(rootfs)], capture_output=True, text=True, timeout=1800
        )
        if made.returncode != 0:
            raise ServerError(f"debootstrap failed: {made.stderr.strip()[-1500:]}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        found.run("import", "-", BASE_IMAGE, stdin=tar.stdout, timeout=900)
        tar.wait(timeout=60)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def _context() -> Path:
    """The build context: wheels/ (the serve set, fetched again only when its inputs change) and project/."""
    wheels, project = CONTEXT / "wheels", CONTEXT / "project"
    CONTEXT.mkdir(mode=0o700, parents=True, exist_ok=True)
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()
    stamp = CONTEXT / "wheels.inputs"
    if not (stamp.exists() and stamp.read_text().strip() == wanted):
        step("image: downloading the serve set's wheels (once)")
        shutil.rmtree(wheels, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels)]
        _pip([*pip, "-c", str(CONSTRAINTS), "-r", str(REQUIREMENTS)])
        stamp.write_text(wanted + "\n")
    for source in (REQUIREMENTS, CONSTRAINTS):
        shutil.copy2(source, wheels / source.name)
    shutil.rmtree(project, ignore_errors=True)
    try:
        project_wheel(project)  # the checkout left as it was (no build/ behind)
    except subprocess.CalledProcessError as err:
        raise ServerError(
            f"building this project's wheel failed (exit {err.returncode}); pip's output is above"
        ) from err
    return CONTEXT


def _pip(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise ServerError(f"{' '.join(command[2:4])} failed: {done.stderr.strip()[-1500:]}")


@dataclass(frozen=True)
class ContainerServe:
    """What `make serve-docker` serves and where."""

    repo: Path
    state_dir: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    health_port: int
    image: str = IMAGE
    timeout_s: float = 300.0


def start(serve: ContainerServe):
    """Serve the repository from a container; its state as `read_state` gives it, once every model is ready.

    Raises:
        ServerError: no engine or image, a root-owned repository, a port taken, or the server did not come up
            (its last log lines in the message).
    """
    from tpserve.common.endpoints import read_state
    from tpserve.server.triton import launcher

    found = engine()
    if not found.has_image(serve.image):
        raise ServerError(f"no image {serve.image}: build it with `make image`")
    repo, state_dir = serve.repo.resolve(), serve.state_dir.absolute()
    # not root: rootless podman maps this user to the image's (keep-id); Docker's group runs it as this user (never
    # root); either way the repository and the state folder are this user's to give
    rootless = os.geteuid() != 0
    _check_readable(repo, rootless)
    running = record(state_dir)
    if running is not None and _running(found, running["name"]):
        raise ServerError(f"{running['name']} serves from {state_dir}: `make stop-docker STATE_DIR={state_dir}` first")
    for label, port in [("http", serve.http_port), ("grpc", serve.grpc_port), ("metrics", serve.metrics_port)]:
        launcher.check_port_free("127.0.0.1", label, port)
    launcher.check_port_free("127.0.0.1", "health", serve.health_port)
    name = "tpserve-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    _run_lent(found, state_dir, rootless, serve.image, _run_args(serve, repo, state_dir, name, rootless, found.name))
    _await(found, name, state_dir, serve.timeout_s)
    if found.name == "podman":  # its HEALTHCHECK runs on systemd's timers, which a host without systemd lacks
        found.run("healthcheck", "run", name, check=False)
    return read_state(state_dir)


def _run_lent(found: Engine, state_dir: Path, rootless: bool, image: str, args: list[str]) -> None:
    """The container run over the state folder lent to it, recorded; a run that fails gives the folder back first
    (a `make serve` after it finds it as it was)."""
    host_owner = _lend_state(state_dir, rootless)
    name = args[args.index("--name") + 1]
    try:
        found.run("rm", "-f", name, check=False)
        found.run(*args)
    except BaseException:
        _give_back(state_dir, {"host_owner": host_owner})
        raise
    _write_record(state_dir, {"engine": found.name, "name": name, "image": image, "host_owner": host_owner})


def _run_args(
    serve: ContainerServe, repo: Path, state_dir: Path, name: str, rootless: bool = False, engine_name: str = "podman"
) -> list[str]:
    """The image's own user (Docker without root: this user), the repository read-only, the state folder the
    container's; the default front, as `server start` serves (Envoy only where the options that need it are given, as
    outside)."""
    ports = ["--http-port", serve.http_port, "--grpc-port", serve.grpc_port, "--metrics-port", serve.metrics_port]
    user = f"{os.geteuid()}:{os.getegid()}" if rootless and engine_name == "docker" else f"{UID}:{UID}"
    return [
        "run",
        "-d",
        *(["--userns", f"keep-id:uid={UID},gid={UID}"] if rootless and engine_name == "podman" else []),
        "--name",
        name,
        "--network",
        "host",
        "--user",
        user,
        "--read-only",
        "--tmpfs",
        "/tmp:rw,mode=1777",
        "--security-opt",
        "no-new-privileges",
        "--env",
        "HOME=/tmp",
        "--env",
        f"TPSERVE_HEALTH_PORT={serve.health_port}",
        "--volume",
        f"{repo}:{repo}:ro",
        "--volume",
        f"{state_dir}:{state_dir}:rw",
        serve.image,
        "--repo",
        str(repo),
        "--state-dir",
        str(state_dir),
        *map(str, ports),
        "--health-port",
        str(serve.health_port),
    ]


def _check_readable(repo: Path, rootless: bool) -> None:
    """Every folder and file of the repository the server reads is readable by the image's user, whoever owns it
    (rootless: this user is that user inside; else others' permission bits decide).

    Raises:
        ServerError: no repository, or a path the container could not read, with how to fix it.
    """
    if not repo.is_dir():
        raise ServerError(f"no repository at {repo}: build one with `make build-engines`")
    me = os.geteuid()
    for path in [repo, *repo.rglob("*")]:
        if "__pycache__" in path.parts or path.is_symlink():
            continue  # what Python caches there is read again from the source where it cannot be
        info = path.stat()
        bits = (0o500 if path.is_dir() else 0o400) if rootless and info.st_uid == me else None
        wanted = bits if bits is not None else (0o005 if path.is_dir() else 0o004)
        if info.st_mode & wanted != wanted:
            raise ServerError(
                f"{path} cannot be read by the container's user (uid {UID}; the container never serves as root): "
                f"make the repository readable to other users (chmod -R o+rX {repo}), then serve it again"
            )


def _lend_state(state_dir: Path, rootless: bool) -> list[int]:
    """The state folder (0700) and its admin key (0600), lent to the image's user while it serves (not root: the
    container runs as this user, nothing to lend); returns the host owner they go back to at stop.

    Raises:
        ServerError: the folder belongs to someone else.
    """
    from tpserve.server.triton import launcher

    if state_dir.exists() and state_dir.stat().st_uid not in (os.geteuid(), UID):
        raise ServerError(f"{state_dir} belongs to uid {state_dir.stat().st_uid}: choose another STATE_DIR")
    if not state_dir.exists() or state_dir.stat().st_uid == os.geteuid():
        launcher.private_state(state_dir)
    key = state_dir / "admin_key"
    if not key.exists():
        launcher.write_key(key)
    owner = [os.geteuid(), os.getegid()]
    if not rootless:  # root: lent to the image's user
        _chown_tree(state_dir, UID, UID)
    return owner


def _chown_tree(folder: Path, uid: int, gid: int) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


def _write_record(state_dir: Path, data: dict) -> None:
    path = state_dir / RECORD
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)


def record(state_dir: Path) -> dict | None:
    """The container serving from state_dir, as `start` recorded it, or None."""
    path = Path(state_dir) / RECORD
    return json.loads(path.read_text()) if path.exists() else None


def _running(found: Engine, name: str) -> bool:
    done = found.run("inspect", "--format", "{{.State.Running}}", name, check=False)
    return done.returncode == 0 and done.stdout.strip() == "true"


def _await(found: Engine, name: str, state_dir: Path, timeout_s: float) -> None:
    from tpserve.common.endpoints import STATE as FRONT
    from tpserve.server.supervision.supervisor import STATE

    deadline = time.monotonic() + timeout_s
    ready = state_dir / STATE  # the supervisor's record: ready once every model is
    while time.monotonic() < deadline:
        if not _running(found, name):
            logs = found.run("logs", "--tail", "40", name, check=False)
            found.run("rm", "-f", name, check=False)
            _give_back(state_dir, record(state_dir))
            raise ServerError(f"the container {name} ended before it was ready:\n{(logs.stdout + logs.stderr)[-3000:]}")
        if ready.exists() and json.loads(ready.read_text() or "{}").get("ready") and (state_dir / FRONT).exists():
            return
        time.sleep(0.5)
    stop(state_dir)
    raise ServerError(
        f"the container {name} was not ready after {timeout_s:.0f} s; its logs: `{found.name} logs {name}`"
    )


def stop(state_dir: Path, timeout_s: int = 90) -> str:
    """Stop the container serving from state_dir (SIGTERM: the supervisor drains), then remove it."""
    found_record = record(state_dir)
    if found_record is None:
        return f"no container serves from {state_dir}"
    found = engine()
    name = found_record["name"]
    found.run("stop", "-t", str(timeout_s), name, check=False, timeout=timeout_s + 60)
    found.run("rm", "-f", name, check=False)
    _give_back(Path(state_dir), found_record)
    return f"container {name} stopped and removed"


def _give_back(state_dir: Path, found_record: dict | None) -> None:
    """The state folder back to its host owner (what the container wrote in it included), the record gone: the
    next `make serve` or `make serve-docker` finds it as it was lent."""
    (state_dir / RECORD).unlink(missing_ok=True)
    owner = (found_record or {}).get("host_owner")
    if owner and os.geteuid() == 0 and state_dir.exists():
        _chown_tree(state_dir, *owner)
