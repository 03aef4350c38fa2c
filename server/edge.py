"""The edge: what Envoy checks on HTTP before a request reaches tritonserver (server/edge.lua).

The rules come from the served repository's config.pbtxt files: each model's inputs (datatype, dims)
and max_batch_size, plus limits on the body, on any one tensor and on JSON nesting.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.errors import ServerError

LUA_SOURCE = Path(__file__).with_name("edge.lua")
BUFFER = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer"
LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
MIB = 1 << 20


@dataclass(frozen=True)
class EdgeLimits:
    """Limits the edge enforces on every HTTP request (bytes; depth in JSON levels)."""

    max_request_bytes: int = 64 * MIB  # the whole body (413 beyond it); chunked bodies included
    max_tensor_bytes: int = 256 * MIB  # any one input, as its shape and datatype declare it
    max_depth: int = 32  # JSON nesting

    def __post_init__(self):
        if min(self.max_request_bytes, self.max_tensor_bytes, self.max_depth) < 1:
            raise ServerError(f"edge limits must be positive: {self}")
        if self.max_depth < 8:
            raise ServerError(f"max_depth {self.max_depth}: inference requests need at least 8 levels")


@dataclass(frozen=True)
class ModelRules:
    max_batch_size: int
    inputs: dict = field(default_factory=dict)  # name -> {"datatype": "FP32", "dims": [...]}


def model_rules(repo: Path) -> dict[str, ModelRules]:
    """Per model of the repository: its inputs and max_batch_size, from config.pbtxt."""
    from tritonclient.grpc import model_config_pb2

    from builders.repository.model_config import parse_pbtxt

    found = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        try:
            config = parse_pbtxt(path.read_text())
        except Exception:  # a config Triton will refuse anyway: the generic rules still hold for its name
            continue
        name = config.name or path.parent.name
        inputs = {
            i.name: {
                "datatype": model_config_pb2.DataType.Name(i.data_type).removeprefix("TYPE_"),
                "dims": [int(d) for d in i.dims],
            }
            for i in config.input
        }
        found[name] = ModelRules(int(config.max_batch_size), _strings_as_bytes(inputs))
    return found


def _strings_as_bytes(inputs: dict) -> dict:
    """TYPE_STRING in a config is BYTES on the wire."""
    return {n: {**i, "datatype": "BYTES" if i["datatype"] == "STRING" else i["datatype"]} for n, i in inputs.items()}


def lua_code(rules: dict[str, ModelRules], limits: EdgeLimits) -> str:
    """edge.lua with its CONFIG: the rules as JSON, read by the script's own parser."""
    config = {
        "models": {n: asdict(r) for n, r in rules.items()},
        "max_tensor_bytes": limits.max_tensor_bytes,
        "max_depth": limits.max_depth,
    }
    text = json.dumps(config, separators=(",", ":"))
    if "]==]" in text:
        raise ServerError("a model or input name holds ']==]', which the edge's configuration cannot carry")
    bootstrap = f"CONFIG = {{max_depth = {limits.max_depth + 8}}}\nCONFIG = parse_json([==[{text}]==])\n"
    return LUA_SOURCE.read_text() + "\n" + bootstrap


def http_filters(rules: dict[str, ModelRules], limits: EdgeLimits) -> list[dict]:
    """Envoy HTTP filters of the edge, before the router: buffer (size cap, chunked bodies), then Lua."""
    return [
        {
            "name": "envoy.filters.http.buffer",
            "typed_config": {"@type": BUFFER, "max_request_bytes": limits.max_request_bytes},
        },
        {
            "name": "envoy.filters.http.lua",
            "typed_config": {"@type": LUA, "default_source_code": {"inline_string": lua_code(rules, limits)}},
        },
    ]
