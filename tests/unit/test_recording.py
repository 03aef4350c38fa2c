"""Recording at the edge (server/edge/recording.py): RECORD's modes, Envoy's access log and gRPC filters (accepted by
the real Envoy), the access log's lines as recorded requests, and rotation under a cap."""

import json
import stat
import subprocess
from pathlib import Path

import pytest

from tpserve.common.errors import ServerError
from tpserve.common.traffic import CURRENT, CURRENT_GRPC, RecordedRequest, read_recording, recording_files
from tpserve.server.edge.envoy_config import GRPC_ERRORS_FILTER, EnvoySettings, Replica, envoy_config
from tpserve.server.edge.front import envoy_binary
from tpserve.server.edge.recording import RecordSettings, access_logs, grpc_filters, prepare, record_settings, rotate
from tpserve.server.edge.request_checks import EdgeLimits, ModelRules, http_filters

ROUTER = "envoy.filters.http.router"
RULES = {"digits_cnn": ModelRules(8, {"input": {"datatype": "FP32", "dims": [1, 8, 8]}})}


@pytest.mark.parametrize(
    "mode, values", [("1", False), ("on", False), ("shapes", False), ("values", True), ("VALUES", True)]
)
def test_record_modes(tmp_path, mode, values):
    settings = record_settings(mode, tmp_path)
    assert settings.values is values and settings.folder == tmp_path.absolute() / "traffic"


def test_record_off_and_unknown_modes(tmp_path):
    assert record_settings("0", tmp_path) is None and record_settings("off", tmp_path) is None
    with pytest.raises(ServerError, match="RECORD='yes please'.*1 .*values"):
        record_settings("yes please", tmp_path)


def _recording_config(tmp_path, values: bool = False) -> dict:
    record = RecordSettings(tmp_path / "traffic", values=values)
    settings = EnvoySettings(
        replicas=(Replica("replica-0", 9100, 9101, 9103),),
        http_port=8000,
        grpc_port=8001,
        stats_port=0,
        admin_socket=str(tmp_path / "envoy-admin.sock"),
        edge_filters=tuple(http_filters(RULES, EdgeLimits(), record)),
        grpc_filters=tuple(grpc_filters(record, RULES)),
        access_logs=access_logs(record),
        grpc_streaming=True,  # streams pass (and stream through unbuffered)
    )
    return envoy_config(settings)


@pytest.mark.parametrize("values", [False, True], ids=["shapes", "values"])
def test_the_real_envoy_accepts_the_recording_config(tmp_path, values):
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(_recording_config(tmp_path, values)))
    prepare(RecordSettings(tmp_path / "traffic"))
    done = subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def _grpc_manager(config: dict) -> dict:
    listeners = {item["name"]: item for item in config["static_resources"]["listeners"]}
    return listeners["triton_grpc"]["filter_chains"][0]["filters"][0]["typed_config"]


def test_http_records_by_access_log_and_grpc_by_the_module_to_a_file_of_its_own(tmp_path):
    config = _recording_config(tmp_path)
    listeners = {item["name"]: item for item in config["static_resources"]["listeners"]}
    manager = listeners["triton_http"]["filter_chains"][0]["filters"][0]["typed_config"]
    line = manager["access_log"][0]["typed_config"]["log_format"]["json_format"]
    assert line["status"] == "%RESPONSE_CODE%" and line["protocol"] == "http"
    assert manager["access_log"][0]["typed_config"]["path"] == str(tmp_path / "traffic" / CURRENT)
    assert "access_log" not in _grpc_manager(config)  # the module writes gRPC's lines, and no access log does
    text = _grpc_manager(config)["http_filters"][0]["typed_config"]["filter_config"]["value"]
    assert text.splitlines()[1] == "log " + str(tmp_path / "traffic" / CURRENT_GRPC).encode().hex()


@pytest.mark.parametrize("values", [False, True], ids=["shapes", "values"])
def test_grpc_streams_through_the_module_unbuffered_shapes_or_values(tmp_path, values):
    manager = _grpc_manager(_recording_config(tmp_path, values=values))
    names = [f["name"] for f in manager["http_filters"]]
    assert names == ["envoy.filters.http.dynamic_modules", GRPC_ERRORS_FILTER, ROUTER]  # no buffer, no Lua
    module = manager["http_filters"][0]["typed_config"]
    config = module["filter_config"]["value"].splitlines()
    assert config[0] == "head_bytes 65536"
    assert (config[1] == f"values {1 << 20}") is values  # the body kept, up to max_value_bytes
    library = Path(module["dynamic_module_config"]["module"]["local"]["filename"])
    assert library.is_file() and stat.S_IMODE(library.parent.stat().st_mode) == 0o700, "code Envoy loads: ours alone"
    routes = {r["match"].get("path"): r for r in manager["route_config"]["virtual_hosts"][0]["routes"]}
    stream = routes["/inference.GRPCInferenceService/ModelStreamInfer"].get("typed_per_filter_config", {})
    assert "envoy.filters.http.buffer" not in stream


def test_an_access_log_line_reads_as_a_recorded_request():
    line = {
        "t": "1795620415284502",
        "model": "digits_cnn",
        "version": None,
        "protocol": "grpc",
        "inputs": [["input", "FP32", [2, 1, 8, 8]]],
        "batch": 2,
        "bytes": 307,
        "status": 0,
        "duration_us": 1379,
        "values": None,
    }
    request = RecordedRequest.from_line(json.dumps(line))
    assert request.arrival_us == 1795620415284502 and request.version == "" and request.batch == 2
    refused = RecordedRequest.from_line(json.dumps({**line, "inputs": None, "batch": None, "status": None}))
    assert refused.inputs == () and refused.batch == 1 and refused.status == -1


def test_the_edge_line_with_its_request_as_json_text_reads_the_same():
    request = {"model": "digits_cnn", "version": "", "inputs": [['in"put\\x', "FP32", [2, 1, 8, 8]]], "batch": 2}
    line = {"t": 5, "protocol": "grpc", "request": json.dumps(request), "bytes": 9, "status": 0, "values": None}
    read = RecordedRequest.from_line(json.dumps(line))
    assert (read.model, read.batch, read.bytes) == ("digits_cnn", 2, 9)
    assert read.inputs[0].name == 'in"put\\x' and read.inputs[0].shape == (2, 1, 8, 8)
    refused = {"model": "m", "version": "", "inputs": [], "batch": 1}
    assert RecordedRequest.from_line(json.dumps({**line, "request": json.dumps(refused)})).inputs == ()


def test_rotation_past_the_size_renames_reopens_and_keeps_the_newest(tmp_path):
    settings = RecordSettings(tmp_path / "traffic", max_file_mb=1 / 1024, max_files=2)  # 1 KiB
    settings.folder.mkdir()
    reopened = []
    line = json.dumps({"t": 1, "model": "m", "protocol": "http", "inputs": []}) + "\n"
    for lines in (100, 100, 100, 10):  # three files past 1 KiB, then one under it
        settings.current.write_text(line * lines)
        rotate(settings, lambda: reopened.append(1))
    names = [p.name for p in recording_files(settings.folder)]
    assert names == ["traffic-000002.jsonl", "traffic-000003.jsonl", CURRENT] and len(reopened) == 3
    assert len(list(read_recording(settings.folder))) == 210
    settings.current.unlink()
    assert rotate(settings, lambda: reopened.append(1)) is None  # nothing current: nothing to do
    settings.current_grpc.write_text(line * 100)  # the gRPC reader's file: renamed, no reopen asked
    assert rotate(settings, lambda: reopened.append(1)).name == "traffic-000004.jsonl" and len(reopened) == 3
    settings.current_grpc.write_text(line * 5)
    settings.current.write_text(line * 7)
    assert [p.name for p in recording_files(settings.folder)][-2:] == [CURRENT, CURRENT_GRPC]
    assert len(list(read_recording(settings.folder))) == 200 + 5 + 7  # two rotated files kept, both current


def test_the_overhead_table_compares_medians_with_the_edge_per_model_and_protocol():
    from benchmarks.record_bench import compare

    rows = [
        {"model": "m", "protocol": "http", "setup": setup, "throughput": t, "p50_ms": 1.0, "round": i}
        for setup, values in (("edge", (100, 90, 110)), ("edge, recording", (95, 99, 60)))
        for i, t in enumerate(values, 1)
    ]
    table = {(t["setup"]): t for t in compare(rows)}
    assert table["edge"]["ratio"] == 1.0 and table["edge, recording"]["ratio"] == 0.95
    assert table["edge, recording"]["paired_ratio"] == 0.829  # geometric mean of 0.95, 1.1, 0.545
    assert table["edge, recording"]["verdict"].startswith("not resolved (3 rounds")
    assert table["edge, recording"]["rounds"] == "95 99 60" and table["edge"]["model"] == "m"
    assert table["edge"]["verdict"] is None  # the baseline against itself says nothing


def test_the_floor_is_called_only_where_the_interval_of_the_paired_ratios_allows_it():
    from benchmarks.record_bench import bootstrap_interval, verdict

    steady = [0.97, 0.98, 0.99, 0.975, 0.985, 0.98, 0.97, 0.99]
    low, high = bootstrap_interval(steady)
    assert 0.95 < low <= high < 1.0 and (low, high) == bootstrap_interval(steady)  # the same rounds, same interval
    assert verdict(low, high, len(steady)) == "within 5%: shown"
    noisy = [0.8, 1.1, 0.9, 1.05, 0.85, 1.0, 0.92, 0.99]
    assert verdict(*bootstrap_interval(noisy), len(noisy)) == "not resolved"
    assert verdict(*bootstrap_interval([0.9, 0.91, 0.89, 0.9, 0.92]), 5) == "over 5%: shown"


def test_the_setups_take_turns_in_both_orders():
    from benchmarks.record_bench import in_order

    assert in_order(("a", "b", "c"), 1) == ["a", "b", "c"] and in_order(("a", "b", "c"), 2) == ["c", "b", "a"]


def test_the_overhead_bench_runs_chosen_setups_beside_its_baseline():
    from benchmarks.record_bench import BASELINE, SETUPS, chosen_setups
    from tpserve.common.errors import MeasurementError

    assert chosen_setups(None) == SETUPS
    assert chosen_setups("2") == (BASELINE, SETUPS[1])  # the baseline is always measured beside
    assert chosen_setups("3 1") == (SETUPS[0], SETUPS[2])
    with pytest.raises(MeasurementError, match="1 edge; 2 edge, recording"):
        chosen_setups("6")
    assert chosen_setups("5") == (BASELINE, "edge, again")  # the control: a second edge like the first


def test_the_overhead_bench_gives_cpu_a_request_from_two_readings():
    from benchmarks.record_bench import _cpu_per_request, _host_busy_seconds, _server_seconds, compare

    assert _cpu_per_request((1.0, 10.0, 100, 50, 3.0), (1.5, 12.0, 1100, 450, 4.0)) == {
        "envoy_cpu_us": 500.0,
        "server_cpu_us": 1000.0,
        "host_cpu_us": 2000.0,
        "mean_batch": 2.5,
    }
    assert _cpu_per_request((None, 10.0, 100, 0), (None, 11.0, 200, 0))["envoy_cpu_us"] is None  # no Envoy: none
    assert _cpu_per_request((1.0, 10.0, 100, 9), (1.0, 10.0, 100, 9))["host_cpu_us"] is None
    assert _server_seconds() >= 0.0  # no server running: nothing, and no error
    first = _host_busy_seconds()
    assert 0 < first <= _host_busy_seconds()
    rows = [
        {
            "model": "m",
            "protocol": "grpc",
            "setup": "edge",
            "throughput": 10,
            "p50_ms": 1,
            "round": i,
            "envoy_cpu_us": us,
            "host_cpu_us": 900.0,
        }
        for i, us in enumerate((140.0, 150.0, None), 1)
    ]
    assert compare(rows)[0]["envoy_cpu_us"] == 145.0 and compare(rows)[0]["host_cpu_us"] == 900.0


def test_each_setup_is_also_compared_with_the_control_and_runs_pool_from_their_points(tmp_path):
    from benchmarks.record_bench import CONTROL, compare, read_points, write
    from tpserve.common.errors import MeasurementError

    rows = [
        {"model": "m", "protocol": "grpc", "setup": setup, "throughput": t, "p50_ms": 1.0, "round": i}
        for setup, values in (("edge", (100, 100)), ("edge, recording", (90, 99)), (CONTROL, (90, 100)))
        for i, t in enumerate(values, 1)
    ]
    table = {t["setup"]: t for t in compare(rows)}
    assert table["edge, recording"]["control_paired_ratio"] == 0.995  # 1.0 and 0.99: against the control
    assert table["edge, recording"]["paired_ratio"] == 0.944 and table[CONTROL]["control_paired_ratio"] is None
    # against both plain edges of each round (their geometric mean): 90 / 94.87 and 99 / 100
    assert table["edge, recording"]["both_paired_ratio"] == 0.969 and table["edge"]["both_paired_ratio"] is None
    first, second = tmp_path / "a", tmp_path / "b"
    write(compare(rows), rows, first, "one")
    write(compare(rows), rows, second, "two")
    pooled = read_points([first / "record_points.csv", second / "record_points.csv"])
    assert sorted({r["round"] for r in pooled}) == [1, 2, 3, 4], "the second run's rounds follow the first's"
    again = {t["setup"]: t for t in compare(pooled)}
    assert again["edge, recording"]["control_paired_ratio"] == 0.995 and again["edge"]["rounds"].count(" ") == 3
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(MeasurementError, match="not a record-bench run"):
        read_points([tmp_path / "x.csv"])


def test_points_are_saved_as_they_come_so_a_run_cut_short_keeps_them(tmp_path):
    from benchmarks.record_bench import compare, read_points, save_points

    first = {"model": "m", "protocol": "grpc", "setup": "edge", "throughput": 100, "p50_ms": 1.0, "round": 1}
    save_points([first], tmp_path)
    later = {**first, "setup": "edge, recording", "throughput": 98, "envoy_cpu_us": 12.0}
    save_points([first, later, {**first, "round": 2}], tmp_path)  # round 2 cut short: no recording point
    rows = read_points([tmp_path / "record_points.csv"])
    assert [r["envoy_cpu_us"] for r in rows] == [None, 12.0, None], "a column a later point brings is kept"
    table = {t["setup"]: t for t in compare(rows)}
    assert table["edge, recording"]["paired_ratio"] == 0.98, "the half round pairs nothing"
    assert not list(tmp_path.glob("*.partial"))


def test_with_fresh_edges_whole_blocks_are_resampled_and_pooled_runs_keep_their_blocks_apart(tmp_path):
    from benchmarks.record_bench import bootstrap_interval, read_points, save_points

    # two blocks whose Envoys differ: each block's rounds agree, the blocks do not
    ratios = [0.9] * 10 + [1.1] * 10
    by_round = bootstrap_interval(ratios)
    by_block = bootstrap_interval(ratios, [1] * 10 + [2] * 10)
    assert by_block[0] < by_round[0] and by_block[1] > by_round[1], "the rounds of a block are not independent"
    assert bootstrap_interval(ratios, list(range(20))) == by_round, "a block a round is the rounds' interval"
    point = {"model": "m", "protocol": "grpc", "setup": "edge", "throughput": 1, "p50_ms": 1, "round": 1, "block": 1}
    save_points([point, {**point, "round": 2, "block": 2}], tmp_path / "a")
    save_points([point], tmp_path / "b")
    pooled = read_points([tmp_path / "a" / "record_points.csv", tmp_path / "b" / "record_points.csv"])
    assert [(r["round"], r["block"]) for r in pooled] == [(1, 1), (2, 2), (3, 3)]


def test_a_point_that_fails_is_measured_once_more_after_the_edge_routes_and_says_so(tmp_path, monkeypatch):
    from benchmarks import record_bench
    from tpserve.common.errors import MeasurementError
    from tpserve.server.edge import front

    calls, waited = [], []

    def points(*args):
        calls.append(args[-1])
        if len(calls) in (1, 4, 5):  # the first point once, the third twice
            raise MeasurementError("perf_analyzer failed (exit 99):\nThread [0] had error: no healthy upstream\n")
        return [{"throughput": 1.0}]

    monkeypatch.setattr(record_bench, "_points", points)
    monkeypatch.setattr(front, "await_routable", lambda socket, replicas, timeout: waited.append(replicas))
    args = (tmp_path, ("m",), ("grpc",), 4, 3000, tmp_path / "edge", tmp_path / "raw" / "r1")
    assert record_bench._points_again_once(*args) == [{"throughput": 1.0, "again": 1}]
    assert calls[1].name == "r1-again" and waited == [1]  # its own raw folder, once the edge routes again
    assert record_bench._points_again_once(*args) == [{"throughput": 1.0}]  # a point that did not fail
    with pytest.raises(MeasurementError, match="no healthy upstream"):  # failing twice ends the run
        record_bench._points_again_once(*args)
