"""Which front `server start` puts before tritonserver (server/fronts.py), and the CLI's refusals of what cannot
go together: each refused before anything starts or is written."""

import json

import pytest
from click.testing import CliRunner

from tpserve.common.endpoints import ServerState, write_state
from tpserve.common.errors import ConfigError
from tpserve.server.__main__ import cli
from tpserve.server.fronts import choose


def test_the_default_front_is_the_checks_in_the_server():
    assert choose("auto")[0] == "server"


@pytest.mark.parametrize("given", [dict(record=True), dict(tls=True), dict(internal_http_port=9000)])
def test_what_only_envoy_serves_brings_envoy_and_says_why(given):
    front, why = choose("auto", **given)
    assert front == "envoy" and "need(s) Envoy" in why


@pytest.mark.parametrize("front", ["server", "none"])
def test_recording_with_another_front_is_refused_with_the_fix(front):
    with pytest.raises(ConfigError, match="--record need.*--front envoy"):
        choose(front, record=True)


def test_an_explicit_front_is_kept():
    assert [choose(f)[0] for f in ("server", "envoy", "none")] == ["server", "envoy", "none"]


def _start(tmp_path, *args):
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True, exist_ok=True)
    (repo / "m" / "config.pbtxt").write_text('name: "m"\n')
    state = tmp_path / "state"
    return CliRunner().invoke(cli, ["start", "--repo", str(repo), "--state-dir", str(state), *args]), state


@pytest.mark.parametrize(
    "args, said",
    [
        (["--front", "server", "--no-edge"], "--front replaces"),
        (["--edge", "--checks-in-server"], "--checks-in-server is for --no-edge"),
        (["--front", "envoy", "--no-supervise"], "needs the supervisor"),
        (["--record", "1", "--no-supervise"], "needs the supervisor"),
        (["--front", "none", "--queue-slo-ms", "20"], "--queue-slo-ms needs"),
        (["--front", "server", "--record", "1"], "--front envoy"),
    ],
)
def test_fronts_that_cannot_go_together_are_refused_before_anything_is_written(tmp_path, args, said):
    done, state = _start(tmp_path, *args)
    assert done.exit_code != 0 and said in done.output, done.output
    assert not (state / "http_checks.json").exists()


def test_the_monitor_scrapes_a_single_servers_supervisor_where_it_admits_by_queue_time(tmp_path):
    from tpserve.loadtest.monitoring.prometheus_server import targets_of
    from tpserve.server.edge.admission_table import FILE

    write_state(
        tmp_path,
        ServerState(
            pid=1, host="127.0.0.1", http_port=1, grpc_port=2, metrics_port=3, repo="r", log="l", admin_key_file="k"
        ),
    )
    (tmp_path / "supervisor.json").write_text(json.dumps({"pid": 1, "health_port": 4}))
    assert [t.job for t in targets_of(tmp_path)] == ["triton"]
    (tmp_path / FILE).write_bytes(b"")
    assert [(t.job, t.address) for t in targets_of(tmp_path)] == [("triton", "127.0.0.1:3"), ("tpserve", "127.0.0.1:4")]


@pytest.mark.parametrize(
    "edge, checks, front",
    [(None, False, "auto"), (False, True, "server"), (True, False, "envoy"), (False, False, "none")],
)
def test_the_flags_before_front_mean_what_they_meant(edge, checks, front):
    from tpserve.server.__main__ import _legacy_front

    assert _legacy_front("auto", edge, checks) == front


def test_the_checks_in_the_server_come_with_private_files_and_a_fresh_cancelled_calls_table(tmp_path):
    """The rules file and the cancelled-calls table the guard maps (0600, the table empty and of its size): the
    guard gives each call its id only where the launcher names a table."""
    import shutil
    from pathlib import Path

    from tpserve.server.fronts import CHECKS_FILE, checks_in_server
    from tpserve.triton_models.python_backend.cancelled_calls import SLOTS

    repo = tmp_path / "repo"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "slow_model", repo)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "cancelled_calls").write_bytes(b"\1" * 8)  # a table left by an earlier run
    found = checks_in_server(repo, tmp_path / "state")
    table = found["cancelled_calls"]
    assert table.stat().st_size == SLOTS * 8 and not any(table.read_bytes()[:4096])
    for path in (table, tmp_path / "state" / CHECKS_FILE):
        assert path.stat().st_mode & 0o777 == 0o600, path
