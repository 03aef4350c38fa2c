"""Folders we load code from are ours alone: created 0700, and refused when another user could write them."""

import os
import pwd
import stat
import tempfile

import pytest

from tpserve.triton_models.runtime.private_dirs import (
    UnsafeFolderError,
    kernel_cache_env,
    private_dir,
    use_private_kernel_cache,
)


def test_a_new_folder_is_created_private(tmp_path):
    path = private_dir(tmp_path / "a" / "b")
    assert (path.stat().st_mode & 0o777) == 0o700


def test_a_folder_others_can_write_is_refused(tmp_path):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(UnsafeFolderError, match="chmod 700"):
        private_dir(tmp_path / "open")


def test_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeFolderError, match="link"):
        private_dir(tmp_path / "link")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user (nobody)")
def test_a_folder_of_another_user_is_refused(tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(tmp_path / "theirs", nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(UnsafeFolderError, match="belongs to uid"):
        private_dir(tmp_path / "theirs")


def test_kernel_caches_live_in_the_given_folder(tmp_path):
    env = kernel_cache_env(tmp_path / "state")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "state" / "kernel-cache")
    assert env["TRITON_CACHE_DIR"].startswith(env["TORCHINDUCTOR_CACHE_DIR"])


def test_a_process_without_a_given_cache_gets_a_private_one(tmp_path, monkeypatch):
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(key, raising=False)
    env = use_private_kernel_cache(tmp_path / "home")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == env["TORCHINDUCTOR_CACHE_DIR"]
    assert "/tmp/torchinductor" not in env["TORCHINDUCTOR_CACHE_DIR"]


def test_a_given_cache_that_others_can_write_is_refused(tmp_path, monkeypatch):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "open"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "open"))
    with pytest.raises(UnsafeFolderError):
        use_private_kernel_cache(tmp_path / "home")


def test_inductors_precompiled_headers_move_into_our_kernel_folder(tmp_path, monkeypatch):
    codecache = pytest.importorskip("torch._inductor.codecache")
    from tpserve.triton_models.runtime.private_dirs import keep_inductor_headers_private

    if not hasattr(codecache, "_HEADER_DIR"):
        pytest.skip("this torch keeps no precompiled headers")
    monkeypatch.setattr(codecache, "_HEADER_DIR", codecache._HEADER_DIR)
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", codecache._HEADER_LOCK_DIR)
    assert codecache._HEADER_DIR.startswith(tempfile.gettempdir())  # torch's own: a shared, predictable path
    headers = keep_inductor_headers_private(tmp_path / "kernel-cache")
    assert codecache._HEADER_DIR == str(headers) == str(tmp_path / "kernel-cache" / "precompiled_headers")
    assert codecache._HEADER_LOCK_DIR == str(headers / "locks")
    assert stat.S_IMODE(headers.stat().st_mode) == 0o700


def test_a_new_kernel_folder_forgets_the_headers_made_in_the_last_one(tmp_path, monkeypatch):
    """A build compiles in a temporary folder removed when it ends: the next build in the same process must not
    reuse header paths inductor remembered there."""
    codecache = pytest.importorskip("torch._inductor.codecache")
    from tpserve.triton_models.runtime.private_dirs import keep_inductor_headers_private

    if not hasattr(codecache, "_precompile_header"):
        pytest.skip("this torch keeps no precompiled headers")
    monkeypatch.setattr(codecache, "_HEADER_DIR", codecache._HEADER_DIR)
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", codecache._HEADER_LOCK_DIR)
    cleared = []
    monkeypatch.setattr(codecache._precompile_header, "cache_clear", lambda: cleared.append(True), raising=False)
    keep_inductor_headers_private(tmp_path / "first")
    keep_inductor_headers_private(tmp_path / "first")  # the same folder: what it remembers still holds
    keep_inductor_headers_private(tmp_path / "second")
    assert len(cleared) == 2
