"""The headless Locust command line (loadtest/locust_suite/run.py)."""

from pathlib import Path

from loadtest.locust_suite.run import STOP_TIMEOUT_S, LocustRun, locust_command


def test_users_finish_the_request_in_flight_before_locust_exits():
    command = locust_command(LocustRun(models=(("m", 1),), users=3, run_time_s=7), Path("/tmp/x"))
    at = command.index("--stop-timeout")
    assert command[at + 1] == str(STOP_TIMEOUT_S) and STOP_TIMEOUT_S > 0
    assert command[command.index("-t") + 1] == "7s" and command[command.index("-u") + 1] == "3"
