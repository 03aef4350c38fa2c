"""How a served tritonserver holds a storm of cancelled gRPC calls (docs/security/grpc_cancel_2core.md).

An instrument, not part of the product: it answers whether the guard (server/triton_guard.c) holds for minutes,
not only for the 20 s of the tests, and what a cancelling client costs. Against a server started by `make serve`
or `make cluster` in STATE_DIR: THREADS clients send async_infer to GRPC_PORT and cancel each call within 0-2 ms
for SECONDS; then it prints the calls made, whether each tritonserver kept its pid, its RSS before and after, and
how long a fresh request waited behind the cancelled calls (they are computed all the same).

    python benchmarks/grpc_cancel.py --state-dir .triton --model digits_cnn --seconds 300
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from clients.infer import build_request
from common import endpoints
from loadtest.benches.soak import rss_mib, served_processes


def servers(state_dir: Path) -> dict[str, int]:
    """'tritonserver' (or 'replica-N tritonserver') -> pid, as the soak finds them."""
    return {label: pid for label, pid in served_processes(state_dir).items() if label.endswith("tritonserver")}


def storm(url: str, model: str, arrays: dict, seconds: float, threads: int = 16) -> int:
    """threads gRPC clients each sending async_infer of arrays to url and cancelling it within 0-2 ms, for seconds;
    the calls made. What crashed tritonserver 2.51 (triton-inference-server/server#8034): a call cancelled as it
    completes. The tests' storms run this too."""
    made = [0] * threads

    def run(index: int) -> None:
        with grpcclient.InferenceServerClient(url) as client:
            inputs, _ = build_request(grpcclient, arrays, [])
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                call = client.async_infer(model, inputs, callback=lambda result, error: None)
                time.sleep(random.random() * 0.002)
                call.cancel()
                made[index] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(made)


def first_answer_s(url: str, model: str, arrays: dict) -> float:
    """Seconds until one fresh request is answered (it queues behind what the storm left)."""
    started = time.monotonic()
    with grpcclient.InferenceServerClient(url) as client:
        client.infer(model, build_request(grpcclient, arrays, [])[0], client_timeout=600)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, default=Path(".triton"))
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--shape", default="1,1,8,8", help="the model's input shape, FP32")
    parser.add_argument("--input", default="input")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    front = endpoints.read_state(args.state_dir)
    arrays = {args.input: np.zeros([int(d) for d in args.shape.split(",")], np.float32)}
    before = servers(args.state_dir)
    rss_before = {name: rss_mib(pid) for name, pid in before.items()}
    made = storm(front.grpc_url, args.model, arrays, args.seconds, args.threads)
    rss_after = {name: rss_mib(pid) for name, pid in before.items()}
    waited = first_answer_s(front.grpc_url, args.model, arrays)
    after = servers(args.state_dir)
    print(
        json.dumps(
            {
                "calls": made,
                "seconds": args.seconds,
                "threads": args.threads,
                "pids_before": before,
                "pids_after": after,
                "restarted": [name for name in before if after.get(name) != before[name]],
                "rss_mib_before": rss_before,
                "rss_mib_after_storm": rss_after,
                "first_fresh_answer_s": round(waited, 3),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
