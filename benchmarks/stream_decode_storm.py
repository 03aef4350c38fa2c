"""Whether a served tritonserver survives concurrent raw ModelStreamInfer clients (2.51 does not: docs/security.md).

An instrument, not part of the product. tritonserver 2.51 crashes (SIGSEGV: the Python backend reads the id of a
freed request) under concurrent streams whose requests overlap, whoever the client is; both fronts therefore refuse
streams unless the server starts with --grpc-streaming. Against a server started in STATE_DIR: CONNECTIONS clients
each open ROUNDS streams to MODEL (one FP32 input X of shape [1, 1]) of MESSAGES requests, then a last frame (--bad: a
message gRPC cannot decode, or just the stream's end), and hang up HOLD_S later without reading the answers; then it
prints whether tritonserver's pid changed. With --grpc-streaming (or `--no-edge`, unguarded) it crashed 2.51 within a
minute on the 2-core host; by default every stream is refused and the pid stays.

    python benchmarks/stream_decode_storm.py --state-dir .triton --model my_model --connections 16 --rounds 60
"""

from __future__ import annotations

import argparse
import random
import socket
import threading
import time
from pathlib import Path

import numpy as np

from tpserve.common import endpoints

STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
BAD = {
    "protobuf": b"\0\0\0\0\x05\xff\xff\xff\xff\xff",  # a tag of field 0's kind: no parser takes it
    "utf8": b"\0\0\0\0\x04\x0a\x02\xc3\x28",  # model_name (a proto3 string) that is not UTF-8
    "end": b"",  # no bad message: the stream's end (an empty DATA frame with END_STREAM)
}


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _message(model: str, name: str) -> bytes:
    import tritonclient.grpc.service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.ones((1, 1), np.float32).tobytes())
    body = request.SerializeToString()
    return b"\0" + len(body).to_bytes(4, "big") + body


def _connection(port: int, good: bytes, bad: bytes, messages: int, hold_s: float) -> None:
    from hpack import Encoder

    headers = [(":method", "POST"), (":scheme", "http"), (":path", STREAM_PATH), (":authority", "x"),
               ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
    opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0) + _frame(1, 4, 1, Encoder().encode(headers))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(opening + b"".join(_frame(0, 0, 1, good) for _ in range(messages)))
            time.sleep(random.random() * 0.004)
            client.sendall(_frame(0, 0 if bad else 1, 1, bad))
            time.sleep(hold_s)
    except OSError:
        pass  # refused while the server restarts: counted by its restarts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=Path(".triton"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", default="X")
    parser.add_argument("--bad", choices=sorted(BAD), default="protobuf")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--hold-s", type=float, default=0.5)
    args = parser.parse_args()
    state = endpoints.read_state(args.state_dir)
    replica = args.state_dir / "replica-0"  # behind the edge: the server's own state
    served = replica if replica.is_dir() else args.state_dir
    pid, good = endpoints.read_state(served).pid, _message(args.model, args.input)

    def client() -> None:
        for _ in range(args.rounds):
            _connection(state.grpc_port, good, BAD[args.bad], args.messages, args.hold_s)

    workers = [threading.Thread(target=client) for _ in range(args.connections)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    time.sleep(3)
    now = endpoints.read_state(served).pid
    print(f"{args.connections * args.rounds} streams ({args.bad}): tritonserver pid {pid} -> {now}")


if __name__ == "__main__":
    main()
