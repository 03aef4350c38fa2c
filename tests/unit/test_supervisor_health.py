"""What the supervisor's readiness says: the server is ready whatever one model's state; a model is ready only
when loaded, not healing or broken, and, for an ensemble, when every step is ready."""

from tpserve.builders.repository.pipelines import write_image_pipelines
from tpserve.builders.spec import zoo
from tpserve.server.supervision.supervisor import Health, _answer
from tpserve.server.triton.launcher import ensemble_steps


def _health(**kw) -> Health:
    health = Health(server_up=True, models={"a", "b", "pipe"}, steps={"pipe": ["a", "b"]})
    for key, value in kw.items():
        setattr(health, key, value)
    return health


def test_one_broken_model_leaves_the_server_and_the_others_ready():
    health = _health(broken={"a": {"reason": "load failed", "attempts": 1, "retry_at": 0}})
    assert health.ready() and health.ready("b")
    assert not health.ready("a") and not health.ready("pipe")
    status, body = _answer(health)("/v2/health/ready")
    assert status == 200 and body["models_not_ready"]["a"] == "broken: load failed"
    status, body = _answer(health)("/v2/models/pipe/ready")
    assert status == 503 and "a" in body["why"]


def test_an_ensemble_is_not_ready_while_a_step_is_unloaded():
    health = _health(models={"b", "pipe"}, unloaded={"a"})
    assert not health.ready("pipe") and health.ready("b")
    assert _answer(health)("/v2/models/pipe/ready")[0] == 503


def test_a_healing_model_reads_not_ready_and_a_down_server_reads_not_ready():
    assert not _health(healing={"a"}).ready("a")
    assert _answer(_health(server_up=False))("/v2/health/ready")[0] == 503


def test_ensemble_steps_are_read_from_the_repository(tmp_path):
    (tmp_path / "digits_cnn").mkdir()
    (tmp_path / "digits_cnn" / "config.pbtxt").write_text('name: "digits_cnn"\n')  # the classifier it names
    write_image_pipelines(tmp_path, zoo.get_spec("digits_cnn"), top_k=3)
    steps = ensemble_steps(tmp_path)
    assert steps["digits_cnn_pipeline"] == ["digits_cnn_preprocess", "digits_cnn", "digits_cnn_postprocess"]


def test_a_model_broken_for_months_keeps_status_and_memory_bounded(caplog):
    """A broken model retried every 30 s for a week: 20,160 events. /status keeps the last KEEP_EVENTS and the
    totals; every event goes to the log with its level."""
    import json
    import logging

    from tpserve.server.supervision.supervisor import KEEP_EVENTS, KEEP_RESTARTS, Health

    health = Health()
    with caplog.at_level(logging.WARNING, logger="supervisor"):
        for attempt in range(20_160):
            health.record(f"digits_cnn: reload failed (attempt {attempt}); trying again in 30 s", logging.WARNING)
    for index in range(1000):
        health.restarts.append({"pid": index})
        health.counts["restarts"] += 1
    status = health.snapshot()
    assert len(status["events"]) == KEEP_EVENTS and len(status["restarts"]) == KEEP_RESTARTS
    assert status["events"][-1][1].startswith("digits_cnn: reload failed (attempt 20159)")
    assert status["events_total"] == 20_160 and status["restarts_total"] == 1000
    assert len(json.dumps(status)) < 64 * 1024
    assert len(caplog.records) == 20_160 and caplog.records[0].levelname == "WARNING"


def test_a_model_that_ran_batches_since_the_last_round_is_busy_not_hung():
    """A probe lost behind a flood is no failure while the model's work count grows; a count that stands still (or
    cannot be read) is no evidence of work."""
    from tpserve.server.supervision.probes import ProbeState, busy

    state = ProbeState()
    assert not busy(state, "resnet50", 100)  # the first look: nothing to compare with
    assert busy(state, "resnet50", 130)
    assert not busy(state, "resnet50", 130)  # wedged: no batch since
    assert not busy(state, "resnet50", None)
    assert busy(state, "resnet50", 131)


def test_the_health_port_answers_readiness_to_anyone_and_the_rest_only_with_the_key(tmp_path):
    """A keyless client learns whether the server is ready, never its pids, restart causes or log tails (/status);
    the owner's private socket answers everything."""
    import socket

    from tpserve.common.endpoints import free_ports
    from tpserve.server.supervision.health_server import HealthServer

    key = tmp_path / "admin_key"
    key.write_text("s3cret\n")
    (port,) = free_ports(1)
    answer = _answer(Health())
    server = HealthServer("127.0.0.1", port, answer, tmp_path / "health.sock", key_file=key)
    server.start()

    def get(path: str, headers: str = "", unix: bool = False) -> int:
        family, address = (
            (socket.AF_UNIX, str(tmp_path / "health.sock")) if unix else (socket.AF_INET, ("127.0.0.1", port))
        )
        with socket.socket(family) as client:
            client.settimeout(5)
            client.connect(address)
            client.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n{headers}\r\n".encode())
            return int(client.recv(65536).split(b" ")[1])

    try:
        assert get("/v2/health/ready") in (200, 503) and get("/v2/models/m/ready") == 503
        assert get("/status") == 403 and get("/status", "admin-key: wrong\r\n") == 403
        assert get("/status", "admin-key: s3cret\r\nadmin-key: s3cret\r\n") == 403  # one key, never two readings
        assert get("/status", "Admin-Key: s3cret\r\n") == 200 and get("/status", unix=True) == 200
        assert get("/metrics") == 200 and get("/elsewhere") == 403
    finally:
        server.shutdown()
