"""A reload that meets a dead server is left to the restart, and a restarted server starts with no stale
marks: its models were loaded by the server itself, so nothing retries (unloads) them under traffic."""

import subprocess

from tpserve.common import endpoints
from tpserve.server.supervision import supervisor
from tpserve.server.supervision.supervisor import Supervisor
from tpserve.server.triton import launcher


def _supervisor(tmp_path) -> Supervisor:
    (tmp_path / "repo" / "a").mkdir(parents=True)
    settings = launcher.ServerSettings(tmp_path / "repo", state_dir=tmp_path / "state")
    return Supervisor(settings, health_port=endpoints.free_ports(1)[0])


def _state(tmp_path, pid: int) -> endpoints.ServerState:
    closed = endpoints.free_ports(1)[0]  # nothing listens: connection refused, as from a killed server
    key = launcher.admin_key(tmp_path / "state")
    return endpoints.ServerState(
        pid=pid,
        host="127.0.0.1",
        http_port=closed,
        grpc_port=closed,
        metrics_port=closed,
        repo=str(tmp_path / "repo"),
        log="",
        admin_key_file=str(key),
    )


def test_a_reload_that_meets_a_dead_server_does_not_mark_the_model_broken(tmp_path):
    sup = _supervisor(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    sup.state = _state(tmp_path, dead.pid)
    sup.health.models = {"a"}
    sup._reload_now("a", "1 stub process(es) gone")
    assert sup.health.broken == {} and sup.health.healing == set()
    assert "the restart loads it" in sup.health.events[-1][1]


def test_a_reload_that_fails_on_a_live_server_is_retried_with_backoff(tmp_path, monkeypatch):
    sup = _supervisor(tmp_path)
    sup.state = _state(tmp_path, 1)
    monkeypatch.setattr(supervisor, "is_tritonserver", lambda pid: True)  # up but not answering (frozen)
    sup._reload_now("a", "3 probes in a row got no answer")
    assert sup.health.broken["a"]["attempts"] == 1


def test_a_restarted_server_clears_the_dead_servers_marks(tmp_path, monkeypatch):
    sup = _supervisor(tmp_path)
    sup.health.broken = {"a": {"reason": "Connection refused", "attempts": 1, "retry_at": 0.0}}
    sup.health.healing = {"a"}
    monkeypatch.setattr(launcher, "start", lambda settings: _state(tmp_path, 1))
    monkeypatch.setattr(supervisor, "stub_pids", lambda pid, repo: {})
    monkeypatch.setattr(Supervisor, "_loaded", lambda self: ["a"])
    sup._start_server()
    assert sup.health.broken == {} and sup.health.healing == set()
    assert sup.health.ready("a")


def test_a_retry_skips_a_model_whose_mark_was_cleared(tmp_path, monkeypatch):
    sup = _supervisor(tmp_path)
    sup.health.broken = {"a": {"reason": "x", "attempts": 1, "retry_at": 0.0}}
    reloaded = []
    monkeypatch.setattr(Supervisor, "_reload", lambda self, model, why: reloaded.append(model))
    real_lock = sup.health.lock

    class ClearsOnSecondUse:  # the restart clears the mark between the retry's look and its reload
        uses = 0

        def __enter__(self):
            real_lock.acquire()
            ClearsOnSecondUse.uses += 1
            if ClearsOnSecondUse.uses == 2:
                sup.health.broken.clear()

        def __exit__(self, *exc):
            real_lock.release()

    sup.health.lock = ClearsOnSecondUse()
    sup._retry_broken()
    assert reloaded == []
