"""What `server start` says when a signal ends tritonserver while it loads models (launcher._crash_cause): the
models it was loading, and for those that warm up, tritonserver 2.51's crash on a refused warmup request."""

from tpserve.common.endpoints import ServerState
from tpserve.server.triton.launcher import _crash_cause

LOG = """
===== tritonserver starting 2026-12-06T09:00:00+0000 =====
I1206 model_lifecycle.cc:472] "loading: old:1"
===== tritonserver starting 2026-12-06T10:00:00+0000 =====
I1206 model_lifecycle.cc:472] "loading: digits:1"
I1206 model_lifecycle.cc:472] "loading: risk:1"
I1206 model_lifecycle.cc:849] "successfully loaded 'digits'"
"""


def _state(tmp_path) -> ServerState:
    (tmp_path / "log").write_text(LOG)
    for name, config in (("digits", "max_batch_size: 8\n"), ("risk", 'model_warmup {\n  name: "w"\n}\n')):
        (tmp_path / "repo" / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "repo" / name / "config.pbtxt").write_text(config)
    return ServerState(
        pid=1, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3, repo=str(tmp_path / "repo"),
        log=str(tmp_path / "log"), admin_key_file="",
    )  # fmt: skip


def test_a_crash_while_loading_names_the_model_and_the_warmup_it_runs(tmp_path):
    said = _crash_cause(_state(tmp_path), -11)
    assert said.startswith(" (signal 11) while loading risk: risk warm(s) up at load")  # digits was loaded; old: before
    assert "zero_data or input_data_file" in said


def test_an_exit_that_is_no_signal_adds_nothing(tmp_path):
    assert _crash_cause(_state(tmp_path), 1) == "" and _crash_cause(_state(tmp_path), None) == ""
