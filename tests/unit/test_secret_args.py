"""The shim (server/triton/triton_shim.c) for real, on a stand-in program: the secret reaches the program's argv
while /proc/<pid>/cmdline and the environment keep only the placeholder; docker/serve.sh does the same
with a key file."""

import os
import subprocess
import sys
import time
from pathlib import Path

from tpserve.server.triton.preloads import FD_VARIABLE, PLACEHOLDER, pass_secret

ROOT = Path(__file__).parents[2]
# prints what main() received, then waits so that its /proc entries can be read
ECHO = "import os, sys, time; print(sys.argv[1], os.environ.get('LD_PRELOAD', '-'), flush=True); time.sleep(3)"


def _run_and_inspect(command: list[str], env: dict, fds=(), stdin=None) -> tuple[str, bytes, bytes]:
    process = subprocess.Popen(command, env=env, pass_fds=fds, stdout=subprocess.PIPE, stdin=stdin)
    for fd in fds:
        os.close(fd)
    time.sleep(1.0)
    cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{process.pid}/environ").read_bytes()
    out, _ = process.communicate(timeout=30)
    return out.decode(), cmdline, environ


def test_the_secret_reaches_main_but_not_proc(shim):
    env, fd = pass_secret(dict(os.environ), "s3cret-key")
    out, cmdline, environ = _run_and_inspect([sys.executable, "-c", ECHO, f"key={PLACEHOLDER}"], env, (fd,))
    printed, preload = out.split()
    assert printed == "key=s3cret-key"
    assert preload == "-"  # children of the program do not load the shim
    assert b"s3cret-key" not in cmdline and PLACEHOLDER.encode() in cmdline
    assert b"s3cret-key" not in environ and FD_VARIABLE.encode() in environ  # only the descriptor's number


def test_without_a_secret_the_placeholder_stays(shim):
    env = {**os.environ, "LD_PRELOAD": str(shim)}
    out, _, _ = _run_and_inspect([sys.executable, "-c", ECHO, f"key={PLACEHOLDER}"], env)
    assert out.split()[0] == f"key={PLACEHOLDER}"  # the launcher's key check then refuses to serve


def test_serve_sh_reads_the_key_file(shim, tmp_path):
    key = tmp_path / "admin_key"
    key.write_text("file-key\n")
    program = tmp_path / "fake_tritonserver"
    program.write_text(
        f"#!{sys.executable}\nimport sys, time\nprint(' '.join(sys.argv[1:]), flush=True)\ntime.sleep(3)\n"
    )
    program.chmod(0o755)
    env = {**os.environ, "TRITON_ADMIN_KEY_FILE": str(key), "TRITON_SHIM": str(shim), "TRITON_PROGRAM": str(program)}
    out, cmdline, environ = _run_and_inspect(["sh", str(ROOT / "docker" / "serve.sh"), "--model-repository=/m"], env)
    assert "--http-restricted-api=model-repository" in out and "admin-key=file-key" in out
    assert out.count("file-key") == 2 and "--model-repository=/m" in out
    assert b"file-key" not in cmdline + environ


def test_the_c_compiler_is_the_one_cc_names_or_none(monkeypatch, tmp_path):
    import shutil

    from tpserve.common.native_build import c_compiler

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert c_compiler() is None, "the compiler asked for is missing: not silently replaced"
    monkeypatch.delenv("CC")
    assert c_compiler() == (shutil.which("cc") or shutil.which("gcc"))
    monkeypatch.setenv("CC", "gcc")
    assert c_compiler() == shutil.which("gcc")
