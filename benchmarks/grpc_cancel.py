"""How a served tritonserver holds a storm of cancelled gRPC calls (docs/security/grpc_cancel_2core.md).

An instrument, not part of the product: it answers whether the guard (server/triton/front/) holds for minutes,
not only for the 20 s of the tests, and what a cancelling client costs. Against a server started by `make serve`
or `make cluster` in STATE_DIR: THREADS clients send async_infer to GRPC_PORT and cancel each call within 0-2 ms
for SECONDS; then it prints the calls made, whether each tritonserver kept its pid, its RSS before and after, and
how long a fresh request waited behind the cancelled calls, and what an ordinary client sending ORDINARY_RATE
requests/s beside the storm got (p50/p99, failures and why).

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
from tritonclient.utils import InferenceServerException

from tpserve.clients.infer import build_request
from tpserve.common import endpoints
from tpserve.loadtest.benches.soak import rss_mib, served_processes


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


def ordinary(url: str, model: str, arrays: dict, rate: float, stop: threading.Event, out: list) -> None:
    """An ordinary client beside the storm: rate requests/s (each waits up to 60 s), until stop; appends
    (seconds, error or None) per request to out."""
    # its own connection, as another process would have (gRPC shares one between a process's channels)
    with grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)]) as client:
        inputs, _ = build_request(grpcclient, arrays, [])
        while not stop.wait(1.0 / rate):
            started = time.monotonic()
            try:
                client.infer(model, inputs, client_timeout=60)
                out.append((time.monotonic() - started, None))
            except Exception as err:  # a refusal or a timeout: counted with what it said
                out.append((time.monotonic() - started, str(err)[:160]))


def summary(points: list) -> dict:
    """p50/p99 (ms) of the answered, the failures and their first reasons."""
    answered = sorted(s for s, err in points if err is None)
    failed = [err for _, err in points if err is not None]

    def at(q: float) -> float | None:
        return round(1000 * answered[min(len(answered) - 1, int(q * len(answered)))], 1) if answered else None

    return {
        "sent": len(points),
        "answered": len(answered),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "failed": len(failed),
        "reasons": sorted(set(failed))[:3],
    }


def first_answer_s(url: str, model: str, arrays: dict) -> tuple[float, int]:
    """Seconds until one fresh request is answered (it queues behind what the storm left; a refusal of a full
    queue is tried again 100 ms later, as a client told to retry would), and the refusals it met."""
    started, refused = time.monotonic(), 0
    with grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)]) as client:
        while True:
            try:
                client.infer(model, build_request(grpcclient, arrays, [])[0], client_timeout=600)
                return time.monotonic() - started, refused
            except InferenceServerException as err:
                if err.status() != "StatusCode.UNAVAILABLE" or time.monotonic() - started > 600:
                    raise
                refused += 1
                time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, default=Path(".triton"))
    parser.add_argument("--model", default="digits_cnn")
    parser.add_argument("--shape", default="1,1,8,8", help="the model's input shape, FP32")
    parser.add_argument("--input", default="input")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--ordinary-rate", type=float, default=2.0, help="an ordinary client's requests/s (0: none)")
    args = parser.parse_args()
    front = endpoints.read_state(args.state_dir)
    arrays = {args.input: np.zeros([int(d) for d in args.shape.split(",")], np.float32)}
    before = servers(args.state_dir)
    rss_before = {name: rss_mib(pid) for name, pid in before.items()}
    stop = threading.Event()
    beside: list = []
    client = threading.Thread(
        target=ordinary, args=(front.grpc_url, args.model, arrays, args.ordinary_rate, stop, beside)
    )
    if args.ordinary_rate > 0:
        client.start()
    made = storm(front.grpc_url, args.model, arrays, args.seconds, args.threads)
    stop.set()
    if args.ordinary_rate > 0:
        client.join()
    rss_after = {name: rss_mib(pid) for name, pid in before.items()}
    waited, refused = first_answer_s(front.grpc_url, args.model, arrays)
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
                "first_fresh_refusals": refused,
                "ordinary_client_during_storm": summary(beside),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
