"""The headless Locust command line (loadtest/locust_suite/run.py)."""

from pathlib import Path

from tpserve.loadtest.locust_suite.run import STOP_TIMEOUT_S, LocustRun, locust_command


def test_users_finish_the_request_in_flight_before_locust_exits():
    command = locust_command(LocustRun(models=(("m", 1),), users=3, run_time_s=7), Path("/tmp/x"))
    at = command.index("--stop-timeout")
    assert command[at + 1] == str(STOP_TIMEOUT_S) and STOP_TIMEOUT_S > 0
    assert command[command.index("-t") + 1] == "7s" and command[command.index("-u") + 1] == "3"


def test_a_sigterm_stops_locust_which_still_ends_its_run(tmp_path):
    """A load held while something else happens (a rollout) is stopped by SIGTERM: passed on to Locust, whose
    own exit code (its report's) comes back."""
    import os
    import signal
    import sys
    import threading
    import time

    from tpserve.loadtest.locust_suite.run import _run_to_end

    child = tmp_path / "fake_locust.py"
    child.write_text(
        "import pathlib, signal, sys, time\n"
        f"done = pathlib.Path({str(tmp_path / 'ended')!r})\n"
        "signal.signal(signal.SIGTERM, lambda *_: (done.write_text('report'), sys.exit(0)))\n"
        f"pathlib.Path({str(tmp_path / 'up')!r}).touch()\n"
        "time.sleep(60)\n"
        "sys.exit(3)\n"
    )

    def stop_when_up():
        while not (tmp_path / "up").exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=stop_when_up, daemon=True).start()
    started = time.monotonic()
    with open(tmp_path / "log", "w") as handle:
        code = _run_to_end([sys.executable, str(child)], dict(os.environ), handle, timeout=50)
    assert code == 0 and (tmp_path / "ended").read_text() == "report"
    assert time.monotonic() - started < 30
    assert signal.getsignal(signal.SIGTERM) is before, "the handler is put back after the run"


def test_a_locust_that_does_not_exit_after_its_sigterm_is_killed_after_the_grace(tmp_path):
    """Seen: Locust printed its summary after a SIGTERM, then hung in a gRPC channel's close at exit."""
    import os
    import signal
    import sys
    import threading
    import time

    from tpserve.loadtest.locust_suite.run import HUNG, _run_to_end

    child = tmp_path / "stuck_locust.py"
    child.write_text(
        "import pathlib, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)\n"
        f"pathlib.Path({str(tmp_path / 'up')!r}).touch()\n"
        "time.sleep(60)\n"
    )

    def stop_when_up():
        while not (tmp_path / "up").exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_up, daemon=True).start()
    started = time.monotonic()
    with open(tmp_path / "log", "w") as handle:
        code = _run_to_end([sys.executable, str(child)], dict(os.environ), handle, timeout=50, grace=1.0)
    assert code == HUNG and time.monotonic() - started < 30


def test_the_run_time_counts_from_the_run_not_from_the_locustfile_import(tmp_path):
    """gevent times Locust's -t from its loop's clock, last read before the locustfile's imports: 2 s of them cut
    a 3 s run to about 1 s (measured: 4 s to 0.5 s after 3 s). loop_time reads the clock afresh at Locust's init."""
    import re
    import subprocess
    import sys
    from datetime import datetime

    locustfile = tmp_path / "slow_import.py"
    locustfile.write_text(
        "import time\n"
        "from locust import User, constant, task\n"
        "from loadtest.locust_suite import loop_time  # noqa: F401\n"
        "until = time.perf_counter() + 2\n"
        "while time.perf_counter() < until:\n"  # blocking work, as an import is
        "    pass\n"
        "class Idle(User):\n"
        "    wait_time = constant(0.1)\n"
        "    @task\n"
        "    def nothing(self):\n"
        "        pass\n"
    )
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", "1", "-r", "1", "-t", "3s"]
    done = subprocess.run(command + ["--only-summary"], cwd=root, capture_output=True, text=True, timeout=120)
    stamps = {}
    for line in done.stderr.splitlines():
        found = re.match(r"\[(\S+ \S+)\].*(All users spawned|run-time limit reached)", line)
        if found:
            stamps[found.group(2)] = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
    ran = (stamps["run-time limit reached"] - stamps["All users spawned"]).total_seconds()
    assert ran >= 2.9, f"a 3 s run lasted {ran:.2f} s"
