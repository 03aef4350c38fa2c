"""The container `make serve-docker` starts (tpserve/server/container.py): what its command line holds and what
it refuses, without an engine."""

from pathlib import Path

import pytest

from tpserve.common.errors import ServerError
from tpserve.server import container


def _args(tmp_path) -> list[str]:
    serve = container.ContainerServe(tmp_path / "repo", tmp_path / "state", 18000, 18001, 18002, 18003)
    return container._run_args(serve, tmp_path / "repo", tmp_path / "state", (1000, 1000), "tpserve-x")


def test_the_container_runs_as_the_owner_read_only_on_the_hosts_loopback_with_no_key_on_its_command_line(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "admin_key").write_text("secret-key\n")
    args = _args(tmp_path)
    assert args[args.index("--user") + 1] == "1000:1000" and "--read-only" in args
    assert args[args.index("--network") + 1] == "host"
    assert f"{tmp_path / 'repo'}:{tmp_path / 'repo'}:ro" in args  # the repository read-only, at its own path
    assert f"{tmp_path / 'state'}:{tmp_path / 'state'}:rw" in args
    assert not any("secret-key" in a or "admin_key" in a for a in args)
    assert args[args.index(container.IMAGE) + 1 :][:2] == ["--repo", str(tmp_path / "repo")]


def test_a_missing_or_root_owned_repository_is_refused_with_how_to_fix_it(tmp_path, monkeypatch):
    with pytest.raises(ServerError, match="no repository at .*make build-engines"):
        container._owner(tmp_path / "nowhere")
    (tmp_path / "repo").mkdir()

    class Root:
        st_uid, st_gid = 0, 0

    monkeypatch.setattr(Path, "is_dir", lambda self: True)
    monkeypatch.setattr(Path, "stat", lambda self, **_: Root())
    with pytest.raises(ServerError, match="never as root.*chown -R USER REPO"):
        container._owner(tmp_path / "repo")
