"""The edge-cost instrument (benchmarks/edge_cost.py): its stripped copies of the edge keep only what each step
says and never the served ports or admin socket; its medians and floors read the rounds as they are."""

from pathlib import Path

from benchmarks import edge_cost
from tpserve.server.edge.envoy_config import Balancing, EnvoySettings, Replica, envoy_config


def _served() -> dict:
    replica = Replica("replica-0", 9100, 9101, 9103, "127.0.0.1")
    checks = {"name": "envoy.filters.http.dynamic_modules", "typed_config": {"filter_name": "edge_checks"}}
    buffer = {"name": "envoy.filters.http.buffer", "typed_config": {}}
    notice = {"name": "edge.cancel_notice", "typed_config": {}}
    settings = EnvoySettings(
        replicas=(replica,),
        http_port=8000,
        grpc_port=8001,
        stats_port=8002,
        admin_socket="/state/envoy-admin.sock",
        balancing=Balancing(max_requests=64),
        edge_filters=(notice, buffer, checks),
        grpc_filters=(notice,),
    )
    return envoy_config(settings)


def _filters(config: dict) -> dict[str, list[str]]:
    return {
        listener["name"]: [
            f["name"] for f in listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        ]
        for listener in config["static_resources"]["listeners"]
    }


def test_each_copy_keeps_what_its_step_says_on_its_own_ports_and_socket(tmp_path: Path):
    served = _served()
    kept = {}
    for variant in edge_cost.VARIANTS:
        config = edge_cost.variant_config(served, variant, 7000, 7001, tmp_path / "admin.sock")
        ports = [
            listener["address"]["socket_address"]["port_value"] for listener in config["static_resources"]["listeners"]
        ]
        assert sorted(ports) == [7000, 7001], "no stats listener, never the served ports"
        assert config["admin"]["address"]["pipe"]["path"] == str(tmp_path / "admin.sock")
        kept[variant.name] = _filters(config)
    router = "envoy.filters.http.router"
    assert kept["no checks"]["triton_http"] == ["edge.cancel_notice", "envoy.filters.http.buffer", router]
    assert "edge.grpc_errors" not in kept["no checks"]["triton_grpc"]
    assert kept["no checks, no buffer"]["triton_http"] == ["edge.cancel_notice", router]
    assert kept["router only"] == {"triton_http": [router], "triton_grpc": [router]}
    plain = edge_cost.variant_config(served, edge_cost.VARIANTS[-1], 7000, 7001, tmp_path / "a.sock")
    assert all("health_checks" not in c for c in plain["static_resources"]["clusters"])
    assert _filters(served)["triton_http"][-1] == router, "the served configuration itself is left as it was"
    assert "health_checks" in served["static_resources"]["clusters"][0]


def _row(target, level, round_, throughput, p50, protocol="grpc"):
    return {
        "protocol": protocol,
        "level": str(level),
        "target": target,
        "round": round_,
        "throughput": throughput,
        "p50_ms": p50,
    }


def test_medians_ratios_and_floors_come_from_the_rounds():
    rows = [
        _row("direct", 1, 1, 1000.0, 1.0),
        _row("direct", 1, 2, 1100.0, 1.1),
        _row("direct", 1, 3, 900.0, 0.9),
        _row("edge", 1, 1, 800.0, 1.3),
        _row("edge", 1, 2, 700.0, 1.2),
        _row("edge", 1, 3, 900.0, 1.05),
        _row("direct", 4, 1, 2000.0, 2.0),
        _row("edge", 4, 1, 1700.0, 2.4),
    ]
    table = edge_cost.compare(rows)
    edge_c1 = next(t for t in table if t["target"] == "edge" and t["concurrency"] == 1)
    assert edge_c1["infer_s"] == 800.0 and edge_c1["ratio"] == 0.8
    assert edge_c1["added_ms"] == 0.2  # median 1.2 against median 1.0
    assert (edge_c1["ratio_low"], edge_c1["ratio_high"]) == (0.636, 1.0)
    said = edge_cost.floors(table)
    assert said == [
        "grpc c1: the edge adds +0.200 ms (floor <= 0.15 ms): missed",
        "grpc c4: the edge keeps 0.85x direct (floor >= 0.8): met",
    ]


def test_the_default_front_is_held_to_a_plain_server_with_no_envoy_measured():
    rows = [
        _row(edge_cost.PLAIN, 1, 1, 1000.0, 1.0),
        _row(edge_cost.IN_SERVER, 1, 1, 990.0, 1.05),
        _row(edge_cost.PLAIN, 4, 1, 2000.0, 2.0),
        _row(edge_cost.IN_SERVER, 4, 1, 1500.0, 2.4),
    ]
    table = edge_cost.compare(rows)
    assert {(t["target"], t["concurrency"]): t["ratio"] for t in table} == {
        (edge_cost.PLAIN, 1): 1.0,
        (edge_cost.IN_SERVER, 1): 0.99,
        (edge_cost.PLAIN, 4): 1.0,
        (edge_cost.IN_SERVER, 4): 0.75,
    }
    assert edge_cost.floors(table) == [
        "grpc c1: the checks in the server add +0.050 ms (floor <= 0.15 ms): met",
        "grpc c4: the checks in the server keep 0.75x the plain server (floor >= 0.8): missed",
    ]
