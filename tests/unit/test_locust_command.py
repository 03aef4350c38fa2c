"""The headless Locust command line (loadtest/locust_suite/run.py)."""

from pathlib import Path

from loadtest.locust_suite.run import STOP_TIMEOUT_S, LocustRun, locust_command


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

    from loadtest.locust_suite.run import _run_to_end

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
