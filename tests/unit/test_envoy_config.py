"""Envoy's generated configuration: accepted by the real Envoy binary (--mode validate), and wired as meant."""

import json
import subprocess
from pathlib import Path

import pytest

from tpserve.server.edge.envoy_config import Balancing, EnvoySettings, Replica, envoy_config
from tpserve.server.edge.front import envoy_binary

REPLICAS = (Replica("replica-0", 9100, 9101, 9103), Replica("replica-1", 9200, 9201, 9203))


def _validate(config: dict, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    return subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(path)], capture_output=True, text=True)


def test_the_real_envoy_accepts_the_generated_config(tmp_path):
    done = _validate(
        envoy_config(
            EnvoySettings(
                replicas=REPLICAS,
                http_port=8000,
                grpc_port=8001,
                stats_port=8002,
                admin_socket="/tmp/t/envoy-admin.sock",
            )
        ),
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_real_envoy_rejects_a_broken_config(tmp_path):
    config = envoy_config(
        EnvoySettings(
            replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=8002, admin_socket="/tmp/t/envoy-admin.sock"
        )
    )
    config["static_resources"]["clusters"][0]["lb_policy"] = "FASTEST_PLEASE"
    assert _validate(config, tmp_path).returncode != 0


def test_routing_health_checks_and_protocols():
    config = envoy_config(
        EnvoySettings(
            replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=8002, admin_socket="/tmp/t/envoy-admin.sock"
        )
    )
    listeners = {item["name"]: item for item in config["static_resources"]["listeners"]}
    clusters = {item["name"]: item for item in config["static_resources"]["clusters"]}
    assert {item["address"]["socket_address"]["address"] for item in listeners.values()} == {"127.0.0.1"}
    assert config["admin"]["address"] == {"pipe": {"path": "/tmp/t/envoy-admin.sock", "mode": 0o600}}
    assert listeners["envoy_stats"]["address"]["socket_address"]["port_value"] == 8002
    for name, port_of in (("replicas_http", lambda r: r.http_port), ("replicas_grpc", lambda r: r.grpc_port)):
        endpoints = clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert [e["endpoint"]["address"]["socket_address"]["port_value"] for e in endpoints] == [
            port_of(r) for r in REPLICAS
        ]
        assert [e["endpoint"]["health_check_config"]["port_value"] for e in endpoints] == [
            r.health_port for r in REPLICAS
        ]
        assert clusters[name]["health_checks"][0]["http_health_check"]["path"] == "/v2/health/ready"
    assert "typed_extension_protocol_options" in clusters["replicas_grpc"]
    assert "typed_extension_protocol_options" not in clusters["replicas_http"]
    route = listeners["triton_grpc"]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
    routed = [r for r in route["virtual_hosts"][0]["routes"] if "route" in r]  # streams: refused by Envoy itself
    retry = {str(r["match"]): r["route"]["retry_policy"]["retry_on"] for r in routed}
    assert "unavailable" in retry[str({"path": "/inference.GRPCInferenceService/ModelInfer"})]
    assert "unavailable" not in retry[str({"prefix": "/"})]  # a refused admin call is not retried


def test_the_stats_port_serves_prometheus_stats_and_nothing_else():
    config = envoy_config(
        EnvoySettings(
            replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=8002, admin_socket="/tmp/t/envoy-admin.sock"
        )
    )
    (stats,) = [item for item in config["static_resources"]["listeners"] if item["name"] == "envoy_stats"]
    routes = stats["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[0]["match"]["path"] == "/stats/prometheus" and routes[0]["route"]["cluster"] == "envoy_admin"
    assert routes[1]["match"] == {"prefix": "/"} and routes[1]["direct_response"]["status"] == 404


@pytest.mark.parametrize(
    "make",
    [
        lambda: EnvoySettings(replicas=(), http_port=1, grpc_port=2, stats_port=3, admin_socket="/s"),
        lambda: EnvoySettings(
            replicas=(REPLICAS[0], REPLICAS[0]), http_port=1, grpc_port=2, stats_port=3, admin_socket="/s"
        ),
        lambda: Balancing(health_interval=0),
        lambda: Balancing(retries=-1),
    ],
    ids=["no-replicas", "duplicate-names", "zero-interval", "negative-retries"],
)
def test_invalid_settings_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_a_stopping_replica_drains_longer_than_envoy_needs_to_notice():
    b = Balancing()
    assert b.drain_seconds > b.health_interval * b.unhealthy_threshold + b.health_timeout


def test_replica_ports_can_be_given_as_a_base():
    from tpserve.common.endpoints import free_ports
    from tpserve.common.errors import ServerError
    from tpserve.server.cluster import ClusterSettings

    base = free_ports(1)[0] // 8 * 8  # a block near a free port; check_port_free refuses a taken one
    settings = ClusterSettings(Path("repo"), replicas=2, replica_base_port=base)
    try:
        assert settings.replica_ports(1) == [base + 4, base + 5, base + 6, base + 7]
    except ServerError as err:  # another process holds one of them right now: the message names it
        assert "in use" in str(err)
    with pytest.raises(ServerError, match="REPLICA_BASE_PORT"):
        ClusterSettings(Path("repo"), replicas=2, replica_base_port=65534)


def test_cluster_state_is_a_typed_record_and_old_files_still_read():
    from tpserve.server.edge.envoy_config import Replica
    from tpserve.server.stack import StackState

    state = StackState(host="127.0.0.1", http_port=1, admin_port=3, repo="/r", replicas=[Replica("replica-0", 4, 5, 6)])
    assert StackState.from_dict(state.to_dict()) == state and state.replica("replica-0").health_port == 6
    old = {k: v for k, v in state.to_dict().items() if k not in ("stats_port", "format_version")}
    assert StackState.from_dict(old).stats_port == 3  # before stats_port was recorded: Envoy's stats on admin_port
    assert StackState.from_dict({}).replicas == []  # a start cut short before the first replica can be stopped


def test_headers_and_connections_are_bounded(tmp_path):
    settings = EnvoySettings(
        replicas=REPLICAS,
        http_port=8000,
        grpc_port=8001,
        stats_port=8002,
        admin_socket="/tmp/t/envoy-admin.sock",
        max_header_kb=16,
        max_connections=1024,
    )
    config = envoy_config(settings)
    monitor = config["overload_manager"]["resource_monitors"][0]
    assert monitor["typed_config"]["max_active_downstream_connections"] == 1024
    managers = [
        item["filter_chains"][0]["filters"][0]["typed_config"] for item in config["static_resources"]["listeners"]
    ]
    assert all(m.get("max_request_headers_kb") == 16 for m in managers if m["stat_prefix"].startswith("triton"))
    done = _validate(config, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_envoy_health_checks_a_private_socket_when_given():
    replica = Replica("replica-0", 9100, 9101, 9103, health_socket="/tmp/t/replica-0/health.sock")
    cluster = envoy_config(
        EnvoySettings(replicas=(replica,), http_port=8000, grpc_port=8001, stats_port=0, admin_socket="/tmp/t/a.sock")
    )["static_resources"]["clusters"][0]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["health_check_config"] == {"address": {"pipe": {"path": "/tmp/t/replica-0/health.sock"}}}


def test_http_inference_is_retried_on_another_replica_while_its_model_reloads():
    config = envoy_config(
        EnvoySettings(
            replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=8002, admin_socket="/tmp/t/envoy-admin.sock"
        )
    )
    http = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    first = http["route_config"]["virtual_hosts"][0]["routes"][0]
    assert first["match"]["safe_regex"]["regex"].endswith("/infer$")
    assert first["route"]["retry_policy"]["retriable_status_codes"] == [404]


def test_unary_grpc_inference_is_retried_on_not_found_and_nothing_else_is():
    config = envoy_config(
        EnvoySettings(
            replicas=REPLICAS,
            http_port=8000,
            grpc_port=8001,
            stats_port=8002,
            admin_socket="/tmp/t/envoy-admin.sock",
            grpc_streaming=True,
        )
    )
    (grpc,) = [item for item in config["static_resources"]["listeners"] if item["name"] == "triton_grpc"]
    routes = grpc["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    policies = {r["match"].get("path", "catch-all"): r["route"]["retry_policy"] for r in routes}
    unary = policies["/inference.GRPCInferenceService/ModelInfer"]
    assert "retriable-headers" in unary["retry_on"]
    (header,) = unary["retriable_headers"]
    assert header["name"] == "grpc-status" and header["string_match"]["safe_regex"]["regex"] == "5"  # NOT_FOUND only
    for path in ("/inference.GRPCInferenceService/ModelStreamInfer", "catch-all"):  # a stream; a refused admin call
        assert "retriable_headers" not in policies[path] and "retriable-headers" not in policies[path]["retry_on"]


def grpc_routes(streaming: bool) -> dict:
    settings = EnvoySettings(
        replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=8002, admin_socket="/s", grpc_streaming=streaming
    )
    (grpc,) = [
        item for item in envoy_config(settings)["static_resources"]["listeners"] if item["name"] == "triton_grpc"
    ]
    routes = grpc["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    return {r["match"].get("path", "catch-all"): r for r in routes}


def test_grpc_streams_are_answered_by_envoy_unless_streaming_is_asked_for():
    """tritonserver 2.51 crashes under concurrent streams (docs/security.md): by default no stream reaches it, and
    the refusal is Envoy's local reply, which a gRPC client reads as UNIMPLEMENTED (404) with the reason."""
    from tpserve.server.edge.envoy_config import GRPC_STREAM, STREAMING_OFF

    refused = grpc_routes(False)
    assert "route" not in refused[GRPC_STREAM]
    assert refused[GRPC_STREAM]["direct_response"] == {"status": 404, "body": {"inline_string": STREAMING_OFF}}
    assert len(STREAMING_OFF) < 127 and "%" not in STREAMING_OFF  # a grpc-message as the guard writes it too
    assert refused["/inference.GRPCInferenceService/ModelInfer"]["route"]["cluster"]  # unary calls still served
    assert grpc_routes(True)[GRPC_STREAM]["route"]["cluster"] == refused["catch-all"]["route"]["cluster"]


def test_grpc_deadlines_stay_with_the_client_and_the_answer_lua_runs_on_registration_only():
    from tpserve.server.edge.envoy_config import GRPC_ERRORS_FILTER, GRPC_SHM_REGISTER

    config = envoy_config(
        EnvoySettings(
            replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=8002, admin_socket="/tmp/t/envoy-admin.sock"
        )
    )
    listeners = {item["name"]: item for item in config["static_resources"]["listeners"]}
    grpc = listeners["triton_grpc"]["filter_chains"][0]["filters"][0]["typed_config"]
    http = listeners["triton_http"]["filter_chains"][0]["filters"][0]["typed_config"]
    assert grpc["route_config"]["request_headers_to_remove"] == ["grpc-timeout"]  # 2.51 crashes on cancelled calls
    assert "request_headers_to_remove" not in http["route_config"]
    assert [f["name"] for f in grpc["http_filters"]] == [GRPC_ERRORS_FILTER, "envoy.filters.http.router"]
    routes = grpc["route_config"]["virtual_hosts"][0]["routes"]
    lua_on = [r["match"] for r in routes if GRPC_ERRORS_FILTER not in r.get("typed_per_filter_config", {})]
    assert lua_on == [{"path": GRPC_SHM_REGISTER}] and routes[0]["match"] == {"path": GRPC_SHM_REGISTER}


def test_the_generated_config_with_the_answer_lua_is_valid(tmp_path):
    config = envoy_config(
        EnvoySettings(
            replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=0, admin_socket="/tmp/t/envoy-admin.sock"
        )
    )
    done = _validate(config, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_rolling_restart_starts_each_replica_with_its_guard_and_tuning(tmp_path, monkeypatch):
    """cluster-restart reads how the replicas were started from cluster.json: their internal ports (the guard's)
    and tritonserver's tuning, not the defaults (it once restarted replicas without the guard)."""
    from tpserve.common import endpoints
    from tpserve.server import replica, stack
    from tpserve.server.cluster import ClusterSettings
    from tpserve.server.triton import launcher

    tuning = launcher.TritonTuning.parse("--http-thread-count=8", True, "0.9:0.01")
    settings = ClusterSettings(tmp_path / "repo", replicas=2, state_dir=tmp_path, tuning=tuning)
    state = stack._new_state(settings)
    for index in range(2):
        state.replicas.append(Replica(f"replica-{index}", 9100 + 4 * index, 9101 + 4 * index, 9103 + 4 * index))
        (tmp_path / f"replica-{index}").mkdir()
        server = endpoints.ServerState(
            pid=1,
            host="127.0.0.1",
            http_port=1,
            grpc_port=2,
            metrics_port=9102 + 4 * index,
            repo="r",
            log="l",
            admin_key_file="k",
        )
        endpoints.write_state(tmp_path / f"replica-{index}", server)
    stack._write(tmp_path, state)
    started = []
    monkeypatch.setattr(stack, "stop_supervisor", lambda folder: None)
    monkeypatch.setattr(launcher, "stop", lambda folder: None)
    monkeypatch.setattr(stack, "await_routable", lambda *args: None)
    monkeypatch.setattr(replica, "start_supervised", lambda settings, *args, **kw: started.append(settings))
    stack.restart_replicas(tmp_path)
    assert [s.internal for s in started] == [settings.internal] * 2 == [("http", "grpc", "metrics")] * 2
    assert [s.tuning for s in started] == [tuning] * 2
    assert [s.metrics_port for s in started] == [9102, 9106]


def test_a_connection_whose_calls_are_mostly_cancelled_at_once_is_closed_after_50():
    """Envoy's rapid-reset defence, tightened from 500 streams to 50: a cancel storm's connections are closed ten
    times sooner, and its clients reconnect (upstream calls of a 30 s storm: 12,591 against about 60,000 in 20 s)."""
    config = envoy_config(
        EnvoySettings(replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=8002, admin_socket="/tmp/t/a.sock")
    )
    static = config["layered_runtime"]["layers"][0]["static_layer"]
    assert static["overload.premature_reset_total_stream_count"] == 50
    assert static["overload.premature_reset_min_stream_lifetime_seconds"] == 1


def test_requests_that_may_wait_follow_the_repository(tmp_path):
    """Two full batches per instance of the largest model wait at most, per replica, within [64, 4096]: past that
    the circuit breaker refuses at once."""
    from tpserve.server.edge.admission import CEILING, FLOOR, waiting_bound

    def model(name: str, text: str) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n{text}')

    assert waiting_bound(tmp_path) == FLOOR  # nothing to read
    model("big", "max_batch_size: 32\ninstance_group [{ count: 2 kind: KIND_CPU }]")
    model("gpus", "max_batch_size: 8\ninstance_group [{ count: 1 kind: KIND_GPU gpus: [0, 1] }]")
    model("plain", "max_batch_size: 0")
    assert waiting_bound(tmp_path) == 2 * 32 * 2
    model("gpus_more", "max_batch_size: 64\ninstance_group [{ count: 1 kind: KIND_GPU gpus: [0, 1] }]")
    assert waiting_bound(tmp_path) == 2 * 64 * 2
    model("huge", "max_batch_size: 4096")
    assert waiting_bound(tmp_path) == CEILING
    replica = Replica("r0", 1, 2, 3)
    settings = EnvoySettings(
        replicas=(replica,),
        http_port=8000,
        grpc_port=8001,
        stats_port=0,
        admin_socket="/tmp/t/a.sock",
        balancing=Balancing(max_requests=77),
    )
    thresholds = [
        c["circuit_breakers"]["thresholds"][0] for c in envoy_config(settings)["static_resources"]["clusters"]
    ]
    assert thresholds and all(t == {"max_requests": 77, "max_pending_requests": 77} for t in thresholds)


def test_a_grpc_connection_holds_at_most_1024_calls_in_flight():
    """What one connection's hang-up leaves running for nobody is bounded: the gRPC listener advertises
    SETTINGS_MAX_CONCURRENT_STREAMS 1024 (the client's library queues the rest). Not lower: a client multiplexing
    its load on one connection would queue at itself instead of meeting the edge's bound on waiting requests."""
    from tpserve.server.edge.envoy_config import STREAMS_PER_CONNECTION

    settings = EnvoySettings(replicas=REPLICAS, http_port=8000, grpc_port=8001, stats_port=0, admin_socket="/a.sock")
    (grpc,) = [x for x in envoy_config(settings)["static_resources"]["listeners"] if x["name"] == "triton_grpc"]
    manager = grpc["filter_chains"][0]["filters"][0]["typed_config"]
    assert (
        manager["http2_protocol_options"]
        == {"max_concurrent_streams": STREAMS_PER_CONNECTION}
        == {"max_concurrent_streams": 1024}
    )


def test_the_decoupled_models_of_a_repository_are_named(tmp_path):
    """`server start` names them when it refuses streams: they answer only there."""
    from tpserve.server.edge.request_checks import decoupled_models

    for name, policy in (("gen", "model_transaction_policy { decoupled: true }"), ("cls", "")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{policy}\n')
    assert decoupled_models(tmp_path) == ["gen"]
