"""Envoy's configuration for a cluster of tritonserver replicas, built from typed data.

Two listeners (HTTP/1.1 and gRPC) route to two upstream clusters over the same replicas. Each
replica is health-checked on its supervisor's readiness port (GET /v2/health/ready: 503 while the
server restarts or a model heals), and ejected by outlier detection after consecutive errors.
Requests that fail before a replica answered (connection refused or reset) are retried on another
replica, and gRPC inference calls also on UNAVAILABLE: inference requests have no side effects. Other
gRPC calls are not retried on UNAVAILABLE, which is also what Triton answers a refused admin call.

Envoy's admin interface (which can drain listeners, change log levels and runtime values) listens only
on a Unix socket of mode 0600 in the state folder. The stats port serves GET /stats/prometheus from it
and nothing else, for Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
PREVIOUS_HOSTS = "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
ADMIN_SOCKET_MODE = 0o600
STATS_PATH = "/stats/prometheus"
HTTP_INFER = r"^/v2/models/[A-Za-z0-9_.-]+(/versions/[0-9]+)?/infer$"
GRPC_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
GRPC_INFER = ("/inference.GRPCInferenceService/ModelInfer", GRPC_STREAM)
# tritonserver 2.51 crashes (SIGSEGV in the Python backend) under concurrent ModelStreamInfer streams whose requests
# overlap, whoever the client (docs/security.md): unless asked, the edge answers each stream itself, UNIMPLEMENTED
# (Envoy's local reply to a gRPC request turns HTTP 404 into grpc-status 12 and this text into grpc-message).
STREAMING_OFF = (  # as the guard says it (server/triton/front/h2_admission.h, STREAMING_WHY)
    "ModelStreamInfer is not served here: tritonserver 2.51 crashes under concurrent streams; "
    "unary ModelInfer is served"
)
# Envoy's panic threshold (percent of replicas healthy): below it, Envoy sends to every replica, healthy or not.
# At 1 (Envoy rounds it to a whole percent; 0 turns panic off), only where none is healthy (up to 100 replicas): a
# single server that missed one liveness check on a busy host (a stall of a second) would otherwise have every
# request refused "no healthy upstream" until its next check; sent to it anyway, they wait and are answered.
# While one replica is healthy, those known bad get nothing.
PANIC_PERCENT = 1
GRPC_SHM_REGISTER = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
GRPC_ERRORS_FILTER = "edge.grpc_errors"  # Lua on gRPC answers, on the register route only (server/edge/grpc_errors.lua)
LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
LUA_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute"
GRPC_NOT_FOUND = 5  # Triton's answer for a model with no version loaded (being reloaded there)
BEFORE_ANSWER = "connect-failure,refused-stream,reset-before-request"  # retried: failed before a replica answered
CANARY_TIME = r"^vhost\..+\.route\.canary-.+\.upstream_rq_time$"  # Envoy records it in whole milliseconds
CANARY_BUCKETS_MS: tuple[float, ...] = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 65, 80, 100, 130, 160)
CANARY_BUCKETS_MS += (200, 250)
CANARY_BUCKETS_MS += (320, 400, 500, 650, 800, 1000, 1300, 1600, 2000, 2500, 3200, 4000, 5000, 6500, 8000, 10000)
CANARY_BUCKETS_MS += (15000, 20000, 30000, 60000)
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
DOWNSTREAM_CONNECTIONS = (
    "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)
DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


@dataclass(frozen=True)
class Replica:
    """One tritonserver replica: where it serves, and where its readiness is answered."""

    name: str
    http_port: int
    grpc_port: int
    health_port: int
    host: str = "127.0.0.1"
    health_socket: str = ""  # the supervisor's readiness on a Unix socket (0600): Envoy checks it, not the port


STREAMS_PER_CONNECTION = 1024  # calls in flight on one gRPC connection (the client library queues the rest)
UNDERIVED_MAX_REQUESTS = 4096  # a Balancing whose bound was not derived from a repository (server/edge/admission.py)


@dataclass(frozen=True, kw_only=True)
class Balancing:
    """How Envoy spreads and protects: health checks, outlier ejection, retries, timeouts (seconds)."""

    health_interval: float = 0.5
    health_timeout: float = 1.0
    unhealthy_threshold: int = 1
    healthy_threshold: int = 1
    consecutive_errors: int = 3  # outlier detection: 5xx / gateway errors before ejection
    ejection_time: float = 5.0
    retries: int = 2
    request_timeout: float = 120.0
    max_requests: int = (
        0  # circuit breaker: concurrent requests per upstream cluster (0: the repository's, admission.py)
    )

    @property
    def drain_seconds(self) -> float:
        """How long a stopping replica answers "not ready" first: enough for Envoy to see it (with margin)."""
        return self.health_interval * (self.unhealthy_threshold + 1) + self.health_timeout

    def __post_init__(self):
        if self.health_interval <= 0 or self.health_timeout <= 0 or self.request_timeout <= 0:
            raise ValueError("health_interval, health_timeout and request_timeout must be positive seconds")
        if self.max_requests < 0:
            raise ValueError("max_requests must be >= 0 (0: derived from the repository)")
        if min(self.unhealthy_threshold, self.healthy_threshold, self.consecutive_errors) < 1 or self.retries < 0:
            raise ValueError("thresholds must be >= 1 and retries >= 0")


@dataclass(frozen=True, kw_only=True)
class EnvoySettings:
    """Envoy's listeners, its admin socket and stats port, and the replicas behind it."""

    replicas: tuple[Replica, ...]
    http_port: int
    grpc_port: int
    stats_port: int  # GET /stats/prometheus only (0: no stats listener)
    admin_socket: str  # the admin interface: a Unix socket, mode 0600
    host: str = "127.0.0.1"
    balancing: Balancing = field(default_factory=Balancing)
    edge_filters: tuple = ()  # HTTP filters before the router (server/edge/request_checks.py: size cap, request checks)
    tls: tuple[str, str] | None = None  # (certificate chain, private key) PEM files: the listeners speak TLS
    max_header_kb: int = 60  # request line + headers per request (431 beyond)
    max_connections: int = 0  # downstream connections at once, all listeners together (0: Envoy's default, none)
    grpc_filters: tuple = ()  # HTTP filters before the router on the gRPC listener (server/edge/recording.py)
    access_logs: dict = field(default_factory=dict)  # protocol ('http', 'grpc') -> access log configs
    canary_models: tuple[str, ...] = ()  # HTTP: a share of each one's traffic can go to <model>__candidate
    grpc_streaming: bool = False  # ModelStreamInfer passed to the replicas (off: refused, UNIMPLEMENTED; STREAMING_OFF)

    def __post_init__(self):
        if not self.replicas:
            raise ValueError("a cluster needs at least one replica")
        names = [r.name for r in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replica names must be unique, got {names}")


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def _address(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def _endpoint(replica: Replica, port: int) -> dict:
    return {
        "endpoint": {
            "address": _address(replica.host, port),
            "hostname": replica.name,
            "health_check_config": (
                {"address": {"pipe": {"path": replica.health_socket}}}
                if replica.health_socket
                else {"port_value": replica.health_port}
            ),
        }
    }


def _health_check(b: Balancing) -> dict:
    return {
        "timeout": _duration(b.health_timeout),
        "interval": _duration(b.health_interval),
        "unhealthy_threshold": b.unhealthy_threshold,
        "healthy_threshold": b.healthy_threshold,
        "no_traffic_interval": _duration(b.health_interval),
        "http_health_check": {"path": "/v2/health/ready", "codec_client_type": "HTTP1"},
    }


def _outlier_detection(b: Balancing) -> dict:
    return {
        "consecutive_5xx": b.consecutive_errors,
        "consecutive_gateway_failure": b.consecutive_errors,
        "interval": "1s",
        "base_ejection_time": _duration(b.ejection_time),
        "max_ejection_percent": 50,
    }


def upstream(name: str, s: EnvoySettings, protocol: str) -> dict:
    """The cluster of replicas for one protocol ('http' or 'grpc': HTTP/2 upstream)."""
    port = (lambda r: r.http_port) if protocol == "http" else (lambda r: r.grpc_port)
    waiting = s.balancing.max_requests or UNDERIVED_MAX_REQUESTS
    cluster = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [_endpoint(r, port(r)) for r in s.replicas]}],
        },
        "health_checks": [_health_check(s.balancing)],
        "outlier_detection": _outlier_detection(s.balancing),
        "circuit_breakers": {"thresholds": [{"max_requests": waiting, "max_pending_requests": waiting}]},
        "common_lb_config": {"healthy_panic_threshold": {"value": PANIC_PERCENT}},  # none healthy: send anyway
    }
    if protocol == "grpc":
        options = {"@type": HTTP_OPTIONS, "explicit_http_config": {"http2_protocol_options": {}}}
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": options
        }
    return cluster


def _retry_policy(b: Balancing, retry_on: str, codes: tuple[int, ...] = (), grpc_codes: tuple[int, ...] = ()) -> dict:
    return {
        "retry_on": retry_on
        + (",retriable-status-codes" if codes else "")
        + (",retriable-headers" if grpc_codes else ""),
        **({"retriable_status_codes": list(codes)} if codes else {}),
        # a gRPC error without messages comes back trailers-only: its grpc-status is a response header
        **({"retriable_headers": [_grpc_status(grpc_codes)]} if grpc_codes else {}),
        "num_retries": b.retries,
        "retry_host_predicate": [
            {"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {"@type": PREVIOUS_HOSTS}}
        ],
        "host_selection_retry_max_attempts": 3,
    }


def stream_refused() -> dict:
    """The ModelStreamInfer route while streaming is off: every stream answered by Envoy, never a replica's."""
    refusal = {"status": 404, "body": {"inline_string": STREAMING_OFF}}
    return {"match": {"path": GRPC_STREAM}, "direct_response": refusal}


def _grpc_status(codes: tuple[int, ...]) -> dict:
    return {"name": "grpc-status", "string_match": {"safe_regex": {"regex": "|".join(str(c) for c in codes)}}}


def _route(
    cluster: str,
    b: Balancing,
    match: dict,
    retry_on: str,
    codes: tuple[int, ...] = (),
    grpc_codes: tuple[int, ...] = (),
) -> dict:
    policy = _retry_policy(b, retry_on, codes, grpc_codes)
    action = {"cluster": cluster, "timeout": _duration(b.request_timeout), "retry_policy": policy}
    return {"match": match, "route": action}


def routes(cluster: str, b: Balancing, protocol: str, streaming: bool = True) -> list[dict]:
    """Every request to cluster, retried on another replica when it failed before a replica answered;
    gRPC inference also on UNAVAILABLE (a replica going away), other gRPC calls not (a refused admin call);
    inference also on HTTP 404 and, unary gRPC, NOT_FOUND (the model is being reloaded on that replica: its
    readiness stays up, since one model must not take the others out; inference has no side effects). Never on
    an internal error: a request that crashes a model would crash it on every replica."""
    if protocol == "grpc":
        found = [
            _route(
                cluster,
                b,
                {"path": path},
                BEFORE_ANSWER + ",unavailable",
                grpc_codes=() if path == GRPC_STREAM else (GRPC_NOT_FOUND,),
            )
            for path in GRPC_INFER
        ]
        if not streaming:
            found = [r if r["match"]["path"] != GRPC_STREAM else stream_refused() for r in found]
    else:
        found = [_route(cluster, b, {"safe_regex": {"regex": HTTP_INFER}}, BEFORE_ANSWER, codes=(404,))]
    return found + [_route(cluster, b, {"prefix": "/"}, BEFORE_ANSWER)]


def listener(name: str, s: EnvoySettings, port: int, cluster: str, protocol: str) -> dict:
    """A listener on s.host:port whose every request goes to cluster."""
    manager = {
        "@type": HCM,
        "stat_prefix": name,
        "codec_type": "AUTO",
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": _routes(cluster, s, protocol)}],
            # a client's deadline must not become the server's: 2.51 crashes on calls cancelled as they complete
            **({"request_headers_to_remove": ["grpc-timeout"]} if protocol == "grpc" else {}),
        },
        "http_filters": [
            *(s.edge_filters if protocol == "http" else (*s.grpc_filters, grpc_errors_filter())),
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
        ],
        "stream_idle_timeout": _duration(s.balancing.request_timeout),
        "request_headers_timeout": "10s",  # the whole request line and headers, however slowly they trickle in
        "max_request_headers_kb": s.max_header_kb,
    }
    if protocol == "grpc":  # what one connection's hang-up can leave running for nobody is bounded too
        manager["http2_protocol_options"] = {"max_concurrent_streams": STREAMS_PER_CONNECTION}
    if s.access_logs.get(protocol):
        manager["access_log"] = list(s.access_logs[protocol])
    chain: dict[str, object] = {
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]
    }
    if s.tls:
        chain["transport_socket"] = _tls(s.tls, "h2" if protocol == "grpc" else "http/1.1")
    return {"name": name, "address": _address(s.host, port), "filter_chains": [chain]}


def grpc_errors_filter() -> dict:
    """The gRPC listener's Lua that makes a refused registration of the server's own shared memory say so
    (tritonserver answers it "Unable to open shared memory region"; server/triton/front/wrappers.c refuses it). It reads
    Triton's answer only, never a request, and runs on the register route alone."""
    from pathlib import Path

    source = (Path(__file__).with_name("grpc_errors.lua")).read_text()
    return {
        "name": GRPC_ERRORS_FILTER,
        "typed_config": {"@type": LUA, "default_source_code": {"inline_string": source}},
    }


def _grpc_errors_only_on_register(found: list[dict]) -> list[dict]:
    """Routes for the gRPC listener: the register route first (its Lua on), every other with that Lua off."""
    off = {GRPC_ERRORS_FILTER: {"@type": LUA_PER_ROUTE, "disabled": True}}
    for route in found:
        route["typed_per_filter_config"] = {**route.get("typed_per_filter_config", {}), **off}
    return found


def canary_key(model: str) -> str:
    """The Envoy runtime key holding the percent of model's HTTP inference requests sent to its candidate."""
    return f"canary.{model}"


def canary_stat(model: str, side: str) -> str:
    """The stat prefix of the route taking model's requests to its candidate (side "new") or to itself ("old")."""
    return f"canary-{side}-{model}"


def canary_routes(cluster: str, b: Balancing, models: tuple[str, ...]) -> list[dict]:
    """Per model, a route taking canary_key(model) percent (0 unless set at runtime) of its unpinned HTTP inference
    requests, their path rewritten to <model>__candidate (a request naming a version is never moved)."""
    found = []
    for model in models:
        match = {
            "path": f"/v2/models/{model}/infer",
            "runtime_fraction": {
                "default_value": {"numerator": 0, "denominator": "HUNDRED"},
                "runtime_key": canary_key(model),
            },
        }
        route = _route(cluster, b, match, BEFORE_ANSWER, codes=(404,))
        rewrite = {
            "pattern": {"regex": "^/v2/models/[^/]+/infer$"},
            "substitution": f"/v2/models/{model}__candidate/infer",
        }
        route["route"]["regex_rewrite"] = rewrite
        route["stat_prefix"] = canary_stat(model, "new")
        rest = _route(cluster, b, {"path": f"/v2/models/{model}/infer"}, BEFORE_ANSWER, codes=(404,))
        rest["stat_prefix"] = canary_stat(model, "old")
        found += [route, rest]
    return found


def _routes(cluster: str, s: EnvoySettings, protocol: str) -> list[dict]:
    if protocol == "http" and s.canary_models:
        return canary_routes(cluster, s.balancing, s.canary_models) + routes(cluster, s.balancing, protocol)
    if protocol == "grpc":
        register = _route(cluster, s.balancing, {"path": GRPC_SHM_REGISTER}, BEFORE_ANSWER)
        found = routes(cluster, s.balancing, protocol, s.grpc_streaming)
        return [register, *_grpc_errors_only_on_register(found)]
    return routes(cluster, s.balancing, protocol)


def _tls(files: tuple[str, str], alpn: str) -> dict:
    """TLS termination with the given certificate chain and key (PEM files)."""
    cert, key = files
    context = {
        "tls_certificates": [{"certificate_chain": {"filename": cert}, "private_key": {"filename": key}}],
        "alpn_protocols": [alpn],
    }
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {"@type": DOWNSTREAM_TLS, "common_tls_context": context},
    }


def stats_listener(s: EnvoySettings) -> dict:
    """s.host:s.stats_port: GET /stats/prometheus from the admin socket; anything else 404 (no admin action)."""
    get = [{"name": ":method", "string_match": {"exact": "GET"}}]
    refuse = {"status": 404, "body": {"inline_string": f"only GET {STATS_PATH} is served here\n"}}
    manager = {
        "@type": HCM,
        "stat_prefix": "envoy_stats",
        "codec_type": "HTTP1",
        "route_config": {
            "name": "envoy_stats",
            "virtual_hosts": [
                {
                    "name": "envoy_stats",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"path": STATS_PATH, "headers": get},
                            "route": {"cluster": "envoy_admin", "timeout": "5s"},
                        },
                        {"match": {"prefix": "/"}, "direct_response": refuse},
                    ],
                }
            ],
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    return {
        "name": "envoy_stats",
        "address": _address(s.host, s.stats_port),
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }


def admin_cluster(s: EnvoySettings) -> dict:
    """The admin socket as an upstream, for the stats listener."""
    endpoints = [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": s.admin_socket}}}}]}]
    return {
        "name": "envoy_admin",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "envoy_admin", "endpoints": endpoints},
    }


def envoy_config(s: EnvoySettings) -> dict:
    """The whole bootstrap configuration (write it as JSON; Envoy reads JSON as YAML)."""
    listeners = [
        listener(f"triton_{p}", s, port, f"replicas_{p}", p)
        for p, port in (("http", s.http_port), ("grpc", s.grpc_port))
    ]
    clusters = [upstream(f"replicas_{p}", s, p) for p in ("http", "grpc")]
    if s.stats_port:
        listeners.append(stats_listener(s))
        clusters.append(admin_cluster(s))
    config = {
        "admin": {"address": {"pipe": {"path": s.admin_socket, "mode": ADMIN_SOCKET_MODE}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
        # the canary reads its routes' latency histograms at each poll: merged when asked, in fine buckets
        "stats_flush_on_admin": True,
        "stats_config": {
            "histogram_bucket_settings": [
                {"match": {"safe_regex": {"regex": CANARY_TIME}}, "buckets": list(CANARY_BUCKETS_MS)}
            ]
        },
        # runtime values set through the admin socket (POST /runtime_modify): the canaries' shares
        "layered_runtime": {
            "layers": [{"name": "static", "static_layer": dict(PREMATURE_RESETS)}, {"name": "admin", "admin_layer": {}}]
        },
    }
    if s.max_connections:
        config["overload_manager"] = _overload(s.max_connections)
    return config


# A client connection whose streams are mostly reset before they are a second old is closed after this many
# streams (Envoy's defence against rapid resets; its default: 500). Each call a client cancels at once still costs
# tritonserver's gRPC frontend a call accepted and ended; closing such a connection sooner makes the client
# reconnect (a gRPC client backs off about a second first), which bounds what one client's cancel storm costs.
PREMATURE_RESETS = {
    "overload.premature_reset_total_stream_count": 50,
    "overload.premature_reset_min_stream_lifetime_seconds": 1,
}


def _overload(max_connections: int) -> dict:
    """Envoy refuses downstream connections beyond max_connections (all listeners together)."""
    monitor = {
        "name": "envoy.resource_monitors.global_downstream_max_connections",
        "typed_config": {"@type": DOWNSTREAM_CONNECTIONS, "max_active_downstream_connections": max_connections},
    }
    return {"resource_monitors": [monitor]}
