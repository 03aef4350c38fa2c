"""What the edge's HTTP request checks cost in the process (tpserve/server/triton/front/http_checks.c), per request,
beside what the hop through Envoy costs (docs/cpu/edge_cost_2core.md): the number the design call of issue 65 rests on.

    .venv/bin/python -m benchmarks.checks_cost [--seconds 1] [--out docs/cpu/checks_cost_2core.md]

Compiles benchmarks/native/checks_cost.c with http_checks.c (-O2, the host's C compiler) and times the checks on
the requests the bench of record sends (digits_cnn and ResNet-50 in binary and in JSON, one sentence and 32
sentences of text or ids, a health probe), each with the copy of its bytes a guard that takes a request whole makes.
"""

from __future__ import annotations

import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import click

from tpserve.common.native_build import c_compiler
from tpserve.server.edge.request_checks import EdgeLimits, ModelRules, checks_json

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "native" / "checks_cost.c", HERE.parent / "tpserve" / "server" / "triton" / "front" / "http_checks.c"]
RULES = {
    "digits_cnn": ModelRules(64, {"input": {"datatype": "FP32", "dims": [1, 8, 8]}}),
    "resnet50": ModelRules(64, {"input": {"datatype": "FP32", "dims": [3, 224, 224]}}),
    "text": ModelRules(256, {"TEXT": {"datatype": "BYTES", "dims": [1]}}),
    "ids": ModelRules(256, {"input_ids": {"datatype": "INT64", "dims": [-1]}}),
}
SENTENCE = " ".join(["serving"] * 31) + "."  # 32 tokens


def check_record(method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    """One request in the record format the C checks' drivers read (tests/native/fuzz_checks.c, serve mode): header
    values as HTTP frames them (surrounding spaces dropped)."""
    found = {k.lower(): v.strip(" \t") for k, v in (headers or {}).items()}
    encoding = found["content-encoding"].encode() if "content-encoding" in found else None
    length = found["inference-header-content-length"].encode() if "inference-header-content-length" in found else None
    parts = [method.encode(), path.encode(), encoding or b"", length or b"", body]
    head = (
        f"{len(parts[0])} {len(parts[1])} {int(encoding is not None)} {len(parts[2])} "
        f"{int(length is not None)} {len(parts[3])} {len(body)}\n"
    )
    return head.encode() + b"".join(parts)


def _binary(model: str, name: str, shape: list[int]) -> tuple[str, str, bytes, dict]:
    size = 4
    for d in shape:
        size *= d
    head = json.dumps(
        {
            "inputs": [{"name": name, "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": size}}],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return "POST", f"/v2/models/{model}/infer", head + bytes(size), {"Inference-Header-Content-Length": str(len(head))}


def _json(model: str, name: str, datatype: str, shape: list[int], data: list) -> tuple[str, str, bytes, dict]:
    body = json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}).encode()
    return "POST", f"/v2/models/{model}/infer", body, {}


def requests() -> dict[str, tuple[str, str, bytes, dict]]:
    ids = list(range(101, 133))
    return {
        "health probe (GET /v2/health/ready)": ("GET", "/v2/health/ready", b"", {}),
        "digits_cnn batch 1, binary": _binary("digits_cnn", "input", [1, 1, 8, 8]),
        "digits_cnn batch 1, JSON data": _json("digits_cnn", "input", "FP32", [1, 1, 8, 8], [0.5] * 64),
        "one 32-token sentence, text": _json("text", "TEXT", "BYTES", [1, 1], [SENTENCE]),
        "one 32-token sentence, ids": _json("ids", "input_ids", "INT64", [1, 32], [ids]),
        "32 sentences, text": _json("text", "TEXT", "BYTES", [32, 1], [[SENTENCE]] * 32),
        "32 sentences, ids": _json("ids", "input_ids", "INT64", [32, 32], [ids] * 32),
        "ResNet-50 batch 1, binary (602 KB)": _binary("resnet50", "input", [1, 3, 224, 224]),
        "ResNet-50 batch 1, JSON data (1.1 MB)": _json(
            "resnet50", "input", "FP32", [1, 3, 224, 224], [0.25] * (3 * 224 * 224)
        ),
    }


def measure(seconds: float) -> list[dict]:
    compiler = c_compiler()
    if compiler is None:
        raise click.ClickException("no C compiler (cc/gcc): install one (Debian: apt-get install gcc)")
    with tempfile.TemporaryDirectory() as folder:
        binary, rules = Path(folder) / "checks_cost", Path(folder) / "rules.json"
        subprocess.run([compiler, "-O2", "-o", str(binary), *map(str, SOURCES), "-lm"], check=True)
        rules.write_text(checks_json(RULES, EdgeLimits()), encoding="utf-8")
        out = subprocess.run([str(binary), str(rules), str(seconds)], input=records(), capture_output=True, check=True)
    return rows_of(out.stdout.decode())


def records() -> bytes:
    """The requests, as the harness reads them on stdin."""
    return b"".join(check_record(m, p, b, h) for m, p, b, h in requests().values())


def write_inputs(folder: Path) -> None:
    """The harness's two inputs, for a host where it is compiled and run by hand:
    `cc -O2 -o checks_cost benchmarks/native/checks_cost.c tpserve/server/triton/front/http_checks.c -lm &&
    ./checks_cost FOLDER/rules.json 1 < FOLDER/records.bin > checks.tsv`, then `--tsv checks.tsv`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rules.json").write_text(checks_json(RULES, EdgeLimits()), encoding="utf-8")
    (folder / "records.bin").write_bytes(records())


def rows_of(tsv: str) -> list[dict]:
    """The harness's lines, one per request of requests(), in order."""
    rows = []
    for name, line in zip(requests(), tsv.splitlines(), strict=True):
        _, status, check_ns, copy_ns, size = line.split("\t")
        rows.append({"request": name, "status": int(status), "check_us": float(check_ns) / 1e3,
                     "copy_us": float(copy_ns) / 1e3, "bytes": int(size)})  # fmt: skip
    return rows


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def markdown(rows: list[dict], host: str, cpu: str | None = None) -> str:
    lines = [
        "# What the HTTP request checks cost in the process",
        "",
        f"{host}, {cpu or _cpu()}, {time.strftime('%Y-%m-%d')}; `python -m benchmarks.checks_cost` (one thread, "
        "medians of 5 rounds). *check*: tpserve/server/triton/front/http_checks.c on the whole request (path, headers, "
        "JSON read strictly, inputs against the model's config); *copy*: copying the request's bytes once, as a "
        "guard that takes a request whole does.",
        "",
        "| request | bytes | verdict | check µs | copy µs |",
        "|---|---:|---|---:|---:|",
    ]
    for r in rows:
        verdict = "passes" if r["status"] == 0 else f"refused {r['status']}"
        lines.append(f"| {r['request']} | {r['bytes']:,} | {verdict} | {r['check_us']:,.2f} | {r['copy_us']:,.2f} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--seconds", type=float, default=1.0, show_default=True, help="Per request, over five rounds.")
@click.option("--host", default="this host", show_default=True, help="How the report names the host.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Write the markdown report here.")
@click.option("--inputs", type=click.Path(path_type=Path), default=None, help="Only write the harness's inputs here.")
@click.option("--tsv", type=click.Path(exists=True, path_type=Path), default=None, help="Report these lines instead.")
@click.option("--cpu", default=None, help="The CPU's name, with --tsv.")
def main(seconds, host, out, inputs, tsv, cpu):
    """Time the C checks on the bench of record's requests."""
    if inputs:
        write_inputs(inputs)
        return
    text = markdown(rows_of(tsv.read_text()) if tsv else measure(seconds), host, cpu)
    click.echo(text)
    if out:
        out.write_text(text)


if __name__ == "__main__":
    main()
