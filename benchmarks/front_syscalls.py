"""Socket calls tritonserver makes per HTTP request: strace -c on every thread of a running server while requests
go over one keep-alive connection (what the default front's reading costs in calls, not in time: strace slows each).

    make serve   # then:
    .venv/bin/python -m benchmarks.front_syscalls --model digits_cnn [--requests 2000] [--state-dir .triton]

Needs strace and the right to trace the server (its user, or root). Prints the calls per request by kind.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import re
import signal
import subprocess
import time
from pathlib import Path

CALLS = "recvfrom,recvmsg,read,readv,ioctl,epoll_wait,writev,sendmsg,write"


def body_for(conn: http.client.HTTPConnection, model: str) -> bytes:
    """One request of the model's FP32 inputs (dims of -1 read as 1, a batch of 1 where the model batches)."""
    conn.request("GET", f"/v2/models/{model}/config")
    config = json.loads(conn.getresponse().read())
    batch = [1] if config.get("max_batch_size", 0) > 0 else []
    inputs = []
    for given in config["input"]:
        if given["data_type"] != "TYPE_FP32":
            raise SystemExit(f"{model}'s input {given['name']} is {given['data_type']}: FP32 inputs only")
        shape = batch + [max(1, int(d)) for d in given["dims"]]
        inputs.append({"name": given["name"], "shape": shape, "datatype": "FP32", "data": [0.5] * math.prod(shape)})
    return json.dumps({"inputs": inputs}).encode()


def count(pid: int, port: int, model: str, requests: int) -> tuple[dict[str, float], float]:
    """Calls per request by kind, and the seconds the requests took under strace."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    body = body_for(conn, model)

    def one() -> None:
        conn.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"{model} answered {answer.status}")

    for _ in range(50):  # warm
        one()
    trace = subprocess.Popen(
        ["strace", "-f", "-c", "-e", f"trace={CALLS}", "-p", str(pid)], stderr=subprocess.PIPE, text=True
    )
    time.sleep(2)  # attached to every thread
    start = time.monotonic()
    for _ in range(requests):
        one()
    took = time.monotonic() - start
    time.sleep(0.5)
    trace.send_signal(signal.SIGINT)
    table = trace.communicate()[1]
    per = {}
    for line in table.splitlines():
        found = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if found:
            per[found.group(2)] = int(found.group(1)) / requests
    return per, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--state-dir", type=Path, default=Path(".triton"))
    args = parser.parse_args()
    server = json.loads((args.state_dir / "server.json").read_text())
    per, took = count(server["pid"], server["http_port"], args.model, args.requests)
    print(f"{args.requests} requests to {args.model} over one connection in {took:.2f} s (under strace)")
    for kind, calls in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:12s} {calls:6.2f} a request")


if __name__ == "__main__":
    main()
