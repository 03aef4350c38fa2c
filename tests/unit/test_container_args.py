"""The container `make serve-docker` starts (tpserve/server/container.py): what its command line holds and what
it refuses, without an engine."""

import os

import pytest

from tpserve.common.errors import ServerError
from tpserve.server import container


def _args(tmp_path, rootless: bool = False) -> list[str]:
    serve = container.ContainerServe(tmp_path / "repo", tmp_path / "state", 18000, 18001, 18002, 18003)
    return container._run_args(serve, tmp_path / "repo", tmp_path / "state", "tpserve-x", rootless)


def test_the_container_runs_as_its_own_user_read_only_with_the_default_front_and_no_key_on_its_command_line(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "admin_key").write_text("secret-key\n")
    args = _args(tmp_path)
    assert args[args.index("--user") + 1] == f"{container.UID}:{container.UID}" and "--read-only" in args
    assert args[args.index("--network") + 1] == "host"
    assert f"{tmp_path / 'repo'}:{tmp_path / 'repo'}:ro" in args  # the repository read-only, at its own path
    assert f"{tmp_path / 'state'}:{tmp_path / 'state'}:rw" in args
    assert not any("secret-key" in a or "admin_key" in a for a in args)
    assert args[args.index(container.IMAGE) + 1 :][:2] == ["--repo", str(tmp_path / "repo")]
    assert "--front" not in args  # the image's entry point serves as `server start` does: the default front
    rootless = _args(tmp_path, rootless=True)  # this user is the image's user inside
    assert rootless[rootless.index("--userns") + 1] == f"keep-id:uid={container.UID},gid={container.UID}"
    serve = container.ContainerServe(tmp_path / "repo", tmp_path / "state", 18000, 18001, 18002, 18003)
    docker = container._run_args(serve, tmp_path / "repo", tmp_path / "state", "x", True, "docker")
    assert docker[docker.index("--user") + 1] == f"{os.geteuid()}:{os.getegid()}" and "--userns" not in docker


def test_a_missing_or_unreadable_repository_is_refused_with_how_to_fix_it(tmp_path):
    with pytest.raises(ServerError, match="no repository at .*make build-engines"):
        container._check_readable(tmp_path / "nowhere", rootless=False)
    model = tmp_path / "repo" / "model"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text("")
    (model / "config.pbtxt").chmod(0o644)
    for folder in (tmp_path / "repo", model):
        folder.chmod(0o755)
    container._check_readable(tmp_path / "repo", rootless=False)  # root's or anyone's: readable by others
    cache = model / "__pycache__"
    cache.mkdir(mode=0o700)  # what the Python backend leaves when served as its owner: not read
    container._check_readable(tmp_path / "repo", rootless=False)
    (model / "config.pbtxt").chmod(0o600)
    with pytest.raises(ServerError, match=r"config.pbtxt cannot be read by the container's user .*chmod -R o\+rX"):
        container._check_readable(tmp_path / "repo", rootless=False)
    container._check_readable(tmp_path / "repo", rootless=True)  # rootless: this owner is the image's user inside


def test_a_run_that_fails_gives_the_state_folder_back(tmp_path, monkeypatch):
    """As root the folder is lent to the image's user; an engine that refuses the run leaves it its owner's, with no
    record of a container."""
    if os.geteuid() != 0:
        pytest.skip("lending the folder to another user needs root")
    state = tmp_path / "state"

    class Refusing(container.Engine):
        def run(self, *args, check: bool = True, **kwargs):
            if args[0] == "run":
                raise ServerError("podman run failed: no such image")
            return None

    with pytest.raises(ServerError, match="podman run failed"):
        container._run_lent(Refusing("podman", {}), state, False, "img", ["run", "--name", "tpserve-x", "img"])
    assert all(p.stat().st_uid == os.geteuid() for p in [state, *state.rglob("*")])
    assert (state / "admin_key").exists() and container.record(state) is None
