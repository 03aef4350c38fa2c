"""Stopping what a command started: a SIGTERM to a measuring command runs its cleanups (the servers a bench started
are stopped, not left running), and a supervisor is known by its pid and its state dir, never by a recycled pid."""

import os
import signal
import subprocess
import sys
import time

from tpserve.server.triton import launcher
from tpserve.server.triton.processes import supervises

HOLDS = """
import sys, time
from pathlib import Path
from tpserve.common.cli import clean_exit_on_sigterm
clean_exit_on_sigterm()
Path(sys.argv[1]).write_text("started")
try:
    time.sleep(60)
finally:
    Path(sys.argv[1]).write_text("cleaned up")
"""


def test_a_sigterm_runs_the_commands_cleanups_and_exits_143(tmp_path):
    mark = tmp_path / "mark"
    child = subprocess.Popen([sys.executable, "-c", HOLDS, str(mark)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not mark.exists():
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 143
    assert mark.read_text() == "cleaned up"


def test_the_measuring_commands_stop_cleanly_on_sigterm():
    """python -m tpserve.loadtest and the tpserve command (tpserve perf, tpserve loadtest) alike."""
    from click.testing import CliRunner

    from tpserve.cli import main
    from tpserve.loadtest.__main__ import cli

    before = signal.getsignal(signal.SIGTERM)
    try:
        for group, args in ((cli, ["text-bench", "--help"]), (main, ["perf", "--help"])):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            CliRunner().invoke(group, args)
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, group
    finally:
        signal.signal(signal.SIGTERM, before)


def _supervisor_like(state_dir, cwd):
    """A process whose command line is a supervisor's of state_dir (as given, relative to cwd)."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen(
        [sys.executable, "-c", code, "-m", "tpserve.server", "supervise", "--state-dir", str(state_dir)], cwd=cwd
    )


def test_a_supervisor_is_known_by_its_state_dir_relative_or_not(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "other").mkdir()
    relative = _supervisor_like("state", tmp_path)
    try:
        time.sleep(0.3)
        assert supervises(relative.pid, tmp_path / "state")
        assert not supervises(relative.pid, tmp_path / "other")
        assert not supervises(os.getpid(), tmp_path / "state")  # a recycled pid: not a supervisor at all
    finally:
        relative.kill()
        relative.wait()
    assert not supervises(relative.pid, tmp_path / "state")


def test_a_record_naming_a_gone_or_foreign_pid_is_no_supervisor(tmp_path):
    record = tmp_path / launcher.SUPERVISOR_STATE
    assert launcher.supervisor_of(tmp_path) is None
    for pid in (os.getpid(), 1, 2**22 + 7, "x", None):
        record.write_text(f'{{"pid": {pid if isinstance(pid, int) else repr(str(pid))!s}}}'.replace("'", '"'))
        assert launcher.supervisor_of(tmp_path) is None, pid
    record.write_text("not json")
    assert launcher.supervisor_of(tmp_path) is None
    other = _supervisor_like(tmp_path, tmp_path)
    try:
        time.sleep(0.3)
        record.write_text(f'{{"pid": {other.pid}}}')
        assert launcher.supervisor_of(tmp_path) == other.pid
        assert "its supervisor, pid" in (launcher.running_from(tmp_path) or "")
    finally:
        other.kill()
        other.wait()
