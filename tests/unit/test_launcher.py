"""Launcher checks that need no running server."""

import dataclasses
import socket
import stat
from pathlib import Path
from unittest import mock

import pytest

from tpserve.common import endpoints
from tpserve.common.errors import ConfigError, ServerError
from tpserve.server.triton import launcher
from tpserve.server.triton.installed import find_install


def test_port_in_use_is_named(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        settings = launcher.ServerSettings(tmp_path, http_port=port, grpc_port=port + 1, metrics_port=port + 2)
        with pytest.raises(ServerError, match=f"http port {port} on 127.0.0.1 is in use"):
            launcher.check_ports_free(settings)


def test_missing_repository_is_refused(tmp_path):
    with pytest.raises(ServerError, match="no model repository"):
        launcher.start(launcher.ServerSettings(tmp_path / "nothing", state_dir=tmp_path / "state"))


def test_admin_key_is_private_and_stable(tmp_path):
    path = launcher.admin_key(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert launcher.admin_key(tmp_path).read_text() == path.read_text()
    assert len(path.read_text().strip()) == 48


def test_command_binds_loopback_and_restricts_admin_apis(tmp_path):
    install = find_install()
    command = launcher.server_command(launcher.ServerSettings(tmp_path), install.binary, tmp_path, "k")
    assert "--http-address=127.0.0.1" in command and "--grpc-address=127.0.0.1" in command
    restricted = "model-repository,shared-memory,statistics,trace,logging:admin-key=k"
    assert f"--http-restricted-api={restricted}" in command
    assert f"--grpc-restricted-protocol={restricted}" in command


def test_latency_summaries_are_on_unless_turned_off(tmp_path):
    install = find_install()

    def command(**tuning):
        settings = launcher.ServerSettings(tmp_path, tuning=launcher.TritonTuning(**tuning))
        return launcher.server_command(settings, install.binary, tmp_path, "k")

    assert "--metrics-config=summary_latencies=true" in command()
    assert f"--metrics-config=summary_quantiles={launcher.DEFAULT_QUANTILES}" in command()
    assert "--metrics-config=summary_quantiles=0.99:0.001" in command(latency_quantiles="0.99:0.001")
    off = command(latency_summaries=False)
    assert "--metrics-config=summary_latencies=false" in off
    assert not any("summary_quantiles" in word for word in off)


@pytest.mark.parametrize("text", ["0.99", "0.99:0", "p99:0.001", "0.5:0.05,,0.99:0.001", "1:0.001"])
def test_a_quantile_tritonserver_would_drop_is_refused(text):
    with pytest.raises(ConfigError, match="LATENCY_QUANTILES.*quantile:error"):
        launcher.TritonTuning.parse(quantiles=text)  # what `make serve` and `make cluster` do before they start
    launcher.TritonTuning.parse(summaries=False, quantiles=text)  # no summaries: their quantiles are not read


def test_tuning_flags_reach_tritonserver_and_nothing_else_does(tmp_path):
    tuning = launcher.TritonTuning.parse(" --grpc-infer-allocation-pool-size=256  --http-thread-count=16 ")
    settings = launcher.ServerSettings(tmp_path, http_port=1, grpc_port=2, metrics_port=3, tuning=tuning)
    command = launcher.server_command(settings, Path("tritonserver"), tmp_path, "k")
    assert command[-2:] == ["--grpc-infer-allocation-pool-size=256", "--http-thread-count=16"]
    for word in (
        "--http-address=0.0.0.0",  # not a tuning flag: where it listens stays ours
        "--grpc-restricted-protocol=admin:k=v",
        "--http-thread-count",  # no value
        "--http-thread-count=16;rm",  # a value of other characters
        "--model-repository=/elsewhere",
    ):
        with pytest.raises(ConfigError, match="SERVER_ARGS.*tuning flags"):
            launcher.TritonTuning.parse(word)


def test_the_supervisor_is_started_with_the_same_tuning(tmp_path):
    """start_supervised passes the record on as `server supervise` options: parsed back, it is the same record."""
    from click.testing import CliRunner

    from tpserve.server.__main__ import supervise

    tuning = launcher.TritonTuning.parse("--http-thread-count=16", False, "0.9:0.01")
    seen = {}
    with mock.patch(
        "tpserve.server.supervision.supervisor.serve", lambda settings, *rest: seen.update(settings=settings)
    ):
        words = ["--repo", str(tmp_path), "--ports", "1", "2", "3", "4", "--internal", "http", *tuning.cli_args()]
        result = CliRunner().invoke(supervise, [*words, "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen["settings"].tuning == tuning and seen["settings"].internal == ("http",)


def test_stop_without_a_server_says_so(tmp_path):
    assert launcher.stop(tmp_path) is False
    with pytest.raises(ServerError, match="no server state"):
        endpoints.read_state(tmp_path)


def _older_onnx_config(spec) -> str:
    """An ONNX Runtime config as written before its tensors crossed the stub through DLPack."""
    from tpserve.builders.repository.writer import model_config

    config = model_config(spec, "embedded")
    del config.parameters["dlpack_outputs"]
    return config.to_pbtxt()


def test_numpy_2_is_refused_only_for_models_that_answer_with_numpy_arrays(tmp_path):
    from tpserve.builders.repository.writer import ServingOptions, TorchRuntime, model_config, torch_config
    from tpserve.builders.spec import zoo
    from tpserve.server.triton.launcher import numpy_problem

    spec = zoo.get_spec("digits_cnn")
    for name, config in (
        ("onnx", _older_onnx_config(spec)),
        ("onnx_dlpack", model_config(spec, "embedded").to_pbtxt()),
        ("torch", torch_config(spec, TorchRuntime(precision="fp32"), ServingOptions()).to_pbtxt()),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(config)
    assert numpy_problem(tmp_path, "1.26.4") is None
    message = numpy_problem(tmp_path, "2.5.2")
    assert "numpy 2.5.2" in message and "numpy==1.26.4" in message and "so onnx would answer wrongly" in message
    assert "rebuild" in message
    (tmp_path / "onnx" / "config.pbtxt").unlink()
    assert numpy_problem(tmp_path, "2.5.2") is None  # ONNX Runtime through DLPack and torch-runtime variants


def test_an_onnx_model_with_bytes_or_bool_tensors_keeps_the_stubs_numpy(tmp_path):
    from tpserve.builders.repository.writer import model_config
    from tpserve.builders.spec import zoo
    from tpserve.builders.spec.model_spec import TensorSpec

    spec = zoo.get_spec("digits_cnn")
    assert model_config(spec, "embedded").parameters["dlpack_outputs"] == 1
    flags = dataclasses.replace(spec, inputs=(*spec.inputs, TensorSpec(name="on", dtype="BOOL", dims=(1,))))
    assert "dlpack_outputs" not in model_config(flags, "embedded").parameters


def test_under_numpy_2_the_rest_is_served_and_what_is_left_out_says_why(tmp_path):
    """An older build wrote an ONNX Runtime variant (numpy answers) beside the torch engine, and pipelines over it: on a
    host with numpy 2 the server loads the engine and leaves the ONNX model and the ensembles calling it out."""
    from tpserve.builders.repository.pipelines import write_image_pipelines
    from tpserve.builders.repository.writer import ServingOptions, TorchRuntime, torch_config
    from tpserve.builders.spec import zoo

    spec = zoo.get_spec("digits_cnn")
    for name, config in (
        ("digits_cnn", _older_onnx_config(spec)),
        ("digits_cnn_fp32", torch_config(spec, TorchRuntime(precision="fp32"), ServingOptions()).to_pbtxt()),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(config)
    write_image_pipelines(tmp_path, spec)
    assert launcher.numpy_left_out(tmp_path, "1.26.4") == {}
    left = launcher.numpy_left_out(tmp_path, "2.5.2")
    assert "numpy 2.5.2" in left["digits_cnn"] and left["digits_cnn_pipeline"].startswith("calls digits_cnn")
    assert "digits_cnn_fp32" not in left
    settings = launcher.ServerSettings(tmp_path, extra_args=("--load-model=*", "--log-verbose=1"))
    loading = launcher._loading_only(settings, left)
    loads = [a.split("=", 1)[1] for a in loading.extra_args if a.startswith("--load-model=")]
    assert loading.model_control == "explicit" and "--log-verbose=1" in loading.extra_args
    assert "digits_cnn_fp32" in loads and not set(loads) & set(left)
    with pytest.raises(ServerError, match="no model of .* can be served here: .*digits_cnn: numpy 2.5.2"):
        launcher._loading_only(settings, {p.parent.name: "why" for p in tmp_path.glob("*/config.pbtxt")} | left)


def test_the_internal_http_port_behind_the_edge_can_be_chosen(tmp_path):
    from tpserve.server.single import SingleSettings

    internal, grpc, metrics, health = endpoints.free_ports(4)
    settings = SingleSettings(
        tmp_path,
        http_port=1,
        grpc_port=grpc,
        metrics_port=metrics,
        health_port=health,
        internal_http_port=internal,
    )
    http, inner_grpc, *rest = settings.replica_ports(0)
    assert [http, *rest] == [internal, metrics, health]
    assert inner_grpc != grpc  # GRPC_PORT is Envoy's: tritonserver's own gRPC port is a free one behind it
    assert settings.internal == ("http", "grpc")


def test_internal_ports_reach_the_guard_as_port_numbers(tmp_path):
    settings = launcher.ServerSettings(tmp_path, http_port=9001, grpc_port=9002, metrics_port=9003)
    assert settings.guard_environment() == {"TRITON_GUARD_OWN_PORTS": "", "TRITON_GUARD_H2_PORTS": ""}
    behind = launcher.ServerSettings(
        tmp_path, http_port=9001, grpc_port=9002, metrics_port=9003, internal=("http", "grpc")
    )
    assert behind.guard_environment() == {"TRITON_GUARD_OWN_PORTS": "9001,9002", "TRITON_GUARD_H2_PORTS": "9002"}
    checked = launcher.ServerSettings(
        tmp_path,
        http_port=9001,
        grpc_port=9002,
        metrics_port=9003,
        http_checks=tmp_path / "checks.json",
        max_waiting=70,
    )
    found = checked.guard_environment()  # clients reach gRPC directly: its port is a public one of the guard
    assert found["TRITON_GUARD_H2_PORTS"] == "9002" and found["TRITON_GUARD_H2_PUBLIC"] == "9002"
    assert found["TRITON_GUARD_MAX_WAITING"] == "70"  # the waiting bound Envoy would hold, held by the guard
    assert found["TRITON_GUARD_FRONT_HTTP"] == "9001"
    assert found["TRITON_GUARD_STREAMING"] == "0"  # ModelStreamInfer refused unless asked for (2.51 crashes)
    assert dataclasses.replace(checked, grpc_streaming=True).guard_environment()["TRITON_GUARD_STREAMING"] == "1"
    with pytest.raises(ConfigError, match="internal ports \\['health'\\]"):
        launcher.ServerSettings(tmp_path, internal=("health",))


def test_a_crash_cause_is_read_without_the_backtrace(tmp_path):
    from tpserve.server.supervision.liveness import crash_cause, log_tail

    log = tmp_path / "tritonserver.log"
    lines = ["===== tritonserver starting 1 =====", "I ok", "terminate called after throwing 'std::bad_alloc'"]
    lines += ["  what():  std::bad_alloc", "Signal (6) received.", *(f" {i}# frame in libc" for i in range(20))]
    log.write_text("\n".join(lines) + "\n")
    assert crash_cause(log) == lines[2:5]
    assert not any("# frame" in line for line in log_tail(log))


def test_a_model_built_before_the_package_rename_is_left_out_saying_rebuild(tmp_path):
    """A repository built before tpserve: its model.py copies import `triton_models`; `make serve` serves the rest
    and names those with the fix instead of failing inside the stub."""
    from tpserve.server.triton.launcher import built_before_tpserve

    for name, text in {
        "old": "from triton_models.cancelled_calls import CancelledCalls\n",
        "new": "from tpserve.triton_models.python_backend.cancelled_calls import CancelledCalls\n",
    }.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(text)
    left = built_before_tpserve(tmp_path)
    assert list(left) == ["old"] and "rebuild it" in left["old"]
