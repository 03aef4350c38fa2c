"""The HTTP request checks' rules, and the edge filters that run them where Envoy fronts the servers.

The checks are one C implementation (server/triton/front/http_checks.c): inside tritonserver's reads with the
default front, and in Envoy as a dynamic module (server/edge/checks_module.c) otherwise. The rules come from the
served repository's config.pbtxt files: each model's inputs (datatype, dims) and max_batch_size, plus limits on
the body, on any one tensor and on JSON nesting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpserve.common.errors import ServerError

CHECKS_MODULE = Path(__file__).with_name("checks_module.c")
FRONT = Path(__file__).parents[1] / "triton" / "front"  # http_checks.c, the checks both fronts run
CHECKS_FILTER = "edge_checks"
BUFFER = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer"
MIB = 1 << 20


# Config override fields a load through the edge may not set: each names files or code the server would
# load (a backend library, an execution environment, warmup data files, repository agents).
REFUSED_OVERRIDE_KEYS = (
    "backend",
    "platform",
    "runtime",
    "parameters",
    "model_warmup",
    "model_repository_agents",
    "cc_model_filenames",
    "model_transaction_policy",
)


@dataclass(frozen=True, kw_only=True)
class EdgeLimits:
    """Limits the edge enforces on every HTTP request (bytes; depth in JSON levels; counts)."""

    max_request_bytes: int = 64 * MIB  # the whole body (413 beyond it); chunked bodies included
    max_tensor_bytes: int = 256 * MIB  # any one input, as its shape and datatype declare it
    max_depth: int = 32  # JSON nesting
    max_keys: int = 64  # keys of any one JSON object (parameters included)
    max_items: int = 64  # items of any one JSON array other than tensor data (inputs, outputs, shape)
    max_header_kb: int = 16  # request line and headers (431 beyond them); tritonserver's own parser stops near 16 KB
    max_connections: int = 1024  # downstream connections Envoy accepts at once, all listeners together
    echo_reading: bool = False  # tests only: answer with header x-edge-read, what the edge read of each input

    def __post_init__(self):
        counts = (self.max_request_bytes, self.max_tensor_bytes, self.max_depth, self.max_keys, self.max_items)
        if min(*counts, self.max_header_kb, self.max_connections) < 1:
            raise ServerError(f"edge limits must be positive: {self}")
        if self.max_depth < 8:
            raise ServerError(f"max_depth {self.max_depth}: inference requests need at least 8 levels")
        if self.max_header_kb > 60:
            raise ServerError(f"max_header_kb {self.max_header_kb}: tritonserver cannot take headers over 60 KB")


@dataclass(frozen=True)
class ModelRules:
    max_batch_size: int
    inputs: dict = field(default_factory=dict)  # name -> {"datatype": "FP32", "dims": [...]}


def model_rules(repo: Path) -> dict[str, ModelRules]:
    """Per model of the repository: its inputs and max_batch_size, from config.pbtxt."""
    from tritonclient.grpc import model_config_pb2

    from tpserve.builders.repository.model_config import repository_configs

    found = {}
    for name, config in repository_configs(repo):
        inputs = {
            i.name: {
                "datatype": model_config_pb2.DataType.Name(i.data_type).removeprefix("TYPE_"),
                "dims": [int(d) for d in i.dims],
            }
            for i in config.input
        }
        found[name] = ModelRules(int(config.max_batch_size), _strings_as_bytes(inputs))
    return found


def decoupled_models(repo: Path) -> list[str]:
    """The repository's models whose transaction policy is decoupled: they answer only on gRPC streams."""
    from tpserve.builders.repository.model_config import repository_configs

    return sorted(name for name, config in repository_configs(repo) if config.model_transaction_policy.decoupled)


def _strings_as_bytes(inputs: dict) -> dict:
    """TYPE_STRING in a config is BYTES on the wire."""
    return {n: {**i, "datatype": "BYTES" if i["datatype"] == "STRING" else i["datatype"]} for n, i in inputs.items()}


def check_config(rules: dict[str, ModelRules], limits: EdgeLimits) -> dict:
    """What the checks read, whoever runs them (server/triton/front/http_checks.c reads it as JSON: checks_json)."""
    return {
        "models": {n: asdict(r) for n, r in rules.items()},
        "max_tensor_bytes": limits.max_tensor_bytes,
        "max_depth": limits.max_depth,
        "max_keys": limits.max_keys,
        "max_items": limits.max_items,
        "refused_override_keys": list(REFUSED_OVERRIDE_KEYS),
    }


def checks_json(rules: dict[str, ModelRules], limits: EdgeLimits) -> str:
    """The rules file of the C checks: check_config as JSON, strings as UTF-8 (no escapes in keys needed)."""
    import json

    return json.dumps(check_config(rules, limits), ensure_ascii=False)


def build_module(force: bool = False) -> Path:
    """Compile the checks into Envoy's dynamic module, .tools/envoy_modules/libedge_checks.so (0700; again only
    where its sources changed).

    Raises:
        ServerError: no C compiler, or the compile failed.
    """
    from tpserve.server.edge.record_module import MODULES_DIR, compile_module

    instead = "or serve with the default front (the checks inside tritonserver: `server start --front server`)"
    library = MODULES_DIR / "libedge_checks.so"
    return compile_module(CHECKS_MODULE, library, "the edge's HTTP checks", instead, force, (FRONT / "http_checks.c",))


def module_config(rules: dict[str, ModelRules], limits: EdgeLimits, record=None) -> str:
    """The module's configuration text (server/edge/checks_module.c reads it): its flags, then the rules' JSON.
    record: a server.edge.recording.RecordSettings, where HTTP is recorded."""
    lines = [f"echo {int(limits.echo_reading)}"]
    if record is not None:
        lines += ["record 1", f"values {int(record.values)}", f"value_bytes {int(record.max_value_bytes)}"]
    return "\n".join(lines) + "\nrules\n" + checks_json(rules, limits)


def http_filters(rules: dict[str, ModelRules], limits: EdgeLimits, record=None) -> list[dict]:
    """Envoy HTTP filters of the edge, before the router: buffer (size cap, chunked bodies), then the checks
    (built first where they are not)."""
    from tpserve.server.edge.record_module import FILTER, dynamic_module_filter

    return [
        {
            "name": "envoy.filters.http.buffer",
            "typed_config": {"@type": BUFFER, "max_request_bytes": limits.max_request_bytes},
        },
        dynamic_module_filter(FILTER, build_module(), CHECKS_FILTER, module_config(rules, limits, record)),
    ]
