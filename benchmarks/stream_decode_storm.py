"""Whether a served tritonserver survives ModelStreamInfer messages gRPC cannot decode (an open finding: it does not).

An instrument, not part of the product. tritonserver 2.51 crashes (SIGSEGV, in the Python backend's execute) when a
ModelStreamInfer stream whose requests are still running is ended by gRPC itself: gRPC ends a stream whose next
message it cannot decode (invalid protobuf, a compressed flag without an encoding) and so cancels the requests that
stream still runs. Neither Envoy nor the guard reads a stream's messages, so both the default path and
`--no-edge --checks-in-server` are open to it. Against a server started in STATE_DIR: CONNECTIONS clients each open
ROUNDS streams, send MESSAGES good requests of MODEL (one FP32 input X of shape [1, 1]) and then one bad message,
and hold the connection HOLD_S; then it prints how many times tritonserver was restarted meanwhile.

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
            client.sendall(_frame(0, 0, 1, bad))
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
    pid, good = state.pid, _message(args.model, args.input)

    def client() -> None:
        for _ in range(args.rounds):
            _connection(state.grpc_port, good, BAD[args.bad], args.messages, args.hold_s)

    workers = [threading.Thread(target=client) for _ in range(args.connections)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    time.sleep(3)
    now = endpoints.read_state(args.state_dir).pid
    streams = args.connections * args.rounds
    print(f"{streams} streams ended by an undecodable message: tritonserver pid {pid} -> {now}")


if __name__ == "__main__":
    main()
