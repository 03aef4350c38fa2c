"""Does the guard (server/triton/front/) hold on this host? An instrument for hosts without Envoy (the offline
bundle carries none): it starts one tritonserver whose HTTP and gRPC ports are internal, as behind the edge, and
attacks those ports straight: another user's chunk bomb (when run as root), a storm of cancelled gRPC calls from
this user (what Envoy would pass on, and more: the client's own resets), and a registration of the Python
backend's IPC region over both protocols. Prints one JSON record.

    python benchmarks/guard_check.py --seconds 60
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_cancel import storm  # beside this file: `python benchmarks/guard_check.py`

from tpserve.server.triton import launcher
from tpserve.server.triton.processes import regions_of

ECHO = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "edge_echo"
CHUNKS = """
import socket
s = socket.create_connection(("127.0.0.1", {port}), timeout=20)
try:
    s.sendall(b"POST /v2/models/echo/infer HTTP/1.1\\r\\nHost: x\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n")
    for _ in range(200):
        s.sendall(b"1\\r\\n \\r\\n" * 10000)
    print("answered", repr(s.recv(100)))
except OSError as err:
    print("closed", type(err).__name__)
"""


def other_user(port: int) -> str:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return "not run (needs root and setpriv)"
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"]
    return subprocess.run([*command, CHUNKS.format(port=port)], capture_output=True, text=True, timeout=120).stdout


def register(state, region: str) -> dict:
    key = state.admin_headers()["admin-key"]
    answers = {}
    clients = (
        ("http", httpclient.InferenceServerClient(state.http_url), {"admin-key": key}),
        ("grpc", grpcclient.InferenceServerClient(state.grpc_url), {"triton-grpc-protocol-admin-key": key}),
    )
    for protocol, client, headers in clients:
        try:
            client.register_system_shared_memory("stolen", region, 4096, headers=headers)
            answers[protocol] = "registered"
        except Exception as err:
            answers[protocol] = f"refused: {str(err)[:120]}"
        client.close()
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    launcher.numpy_problem = lambda *a, **k: None  # echo answers with numpy; under numpy 2 its outputs may be empty
    with tempfile.TemporaryDirectory() as root:
        repo = Path(root) / "repo"
        shutil.copytree(ECHO, repo)
        with launcher.running(repo, Path(root) / "state", internal=("http", "grpc")) as state:
            region = sorted(r for r in regions_of(state.pid) if r.startswith("triton_python_backend"))[0]
            record = {"pid": state.pid, "other_user_chunk_bomb": other_user(state.http_port).strip()}
            record["cancelled_calls"] = storm(state.grpc_url, "echo", {"A": np.ones((1, 4), np.float32)}, args.seconds)
            time.sleep(2)  # the cancelled calls are computed all the same: the region settles once they are done
            before = hashlib.sha256(Path("/dev/shm", region).read_bytes()).hexdigest()
            record["register_backend_region"] = register(state, region)
            record["region_unchanged"] = before == hashlib.sha256(Path("/dev/shm", region).read_bytes()).hexdigest()
            record["pid_after"] = launcher.read_state(Path(root) / "state").pid
            record["server_running"] = Path(f"/proc/{state.pid}").exists()
            with grpcclient.InferenceServerClient(state.grpc_url) as client:
                record["live_after"] = client.is_server_live()
            log = Path(state.log).read_text(errors="replace")
            record["guard_log_lines"] = [line for line in log.splitlines() if "triton_guard" in line][:4]
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
