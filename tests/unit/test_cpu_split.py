"""The client on cores of its own: which cores, and the server's threads pinned for a point and put back."""

import os
import subprocess
import sys

import pytest

from common.errors import MeasurementError
from loadtest.benches import cpu_split


def test_the_client_takes_the_last_cores_and_the_server_keeps_one_at_least():
    assert cpu_split.split_cores(2, {0, 1, 2, 3}) == ({0, 1}, {2, 3})
    for client in (0, 4):
        with pytest.raises(MeasurementError, match="leave the server one"):
            cpu_split.split_cores(client, {0, 1, 2, 3})
    assert cpu_split.describe({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")
def test_every_thread_of_the_servers_session_is_pinned_then_put_back():
    code = (
        "import threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); time.sleep(30)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        tasks = []
        for _ in range(50):  # its second thread starts with the interpreter
            tasks = cpu_split.session_tasks(server.pid)
            if len(tasks) >= 2:
                break
            subprocess.run(["sleep", "0.1"])
        assert len(tasks) >= 2 and os.getpid() not in tasks  # its session, not ours
        everything = set(os.sched_getaffinity(0))
        with cpu_split.client_on_own_cores(server.pid, 1) as (_, client):
            assert len(client) == 1 and client <= everything
            assert all(os.sched_getaffinity(t) == everything - client for t in tasks)
        assert all(os.sched_getaffinity(t) == everything for t in tasks)
    finally:
        server.kill()
        server.wait()
