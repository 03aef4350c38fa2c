"""Streams and frames have deadlines on a gRPC port clients reach directly (server/triton/front/h2_deadlines.c), as HTTP
heads and bodies have: a stream opened with headers and no message, or a frame trickled in a byte at a time, loses its
connection once the head deadline passes (TRITON_GUARD_FRONT_LIMITS' fifth figure, 1 s here), and the program behind
the guard sees the client's calls end as a hung-up client's do, never a reset. A connection with nothing pending stays
open however long it idles. The guard is loaded into a stand-in program that answers every call it is handed whole."""

import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from tpserve.common.endpoints import free_ports

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS = 0, 1, 4
END_STREAM, END_HEADERS = 0x1, 0x4
INFER = b"\x04\x2a/inference.GRPCInferenceService/ModelInfer"  # :path, a literal of the static name
HEAD_MS = 1000
LIMITS = f"{64 << 20},16384,1024,{1 << 30},{HEAD_MS}"

# Accepts one connection on argv[1]; answers each stream the client ended (trailers-only: 200, END_STREAM); prints,
# at the connection's end, the seconds it lasted and the frames it read (type, flags, stream).
STAND_IN = """
import json, select, socket, struct, sys, time
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen(8); print("listening", flush=True)
conn, _ = server.accept(); start = time.monotonic()
read, at, seen = b"", 24, []
while True:
    select.select([conn], [], [], 0.1)
    try:
        chunk = conn.recv(65536)
    except (BlockingIOError, InterruptedError):
        continue
    except ConnectionResetError:
        break
    if not chunk:
        break
    read += chunk
    while at + 9 <= len(read) and at + 9 + int.from_bytes(read[at:at + 3], "big") <= len(read):
        length, kind, flags = int.from_bytes(read[at:at + 3], "big"), read[at + 3], read[at + 4]
        stream = int.from_bytes(read[at + 5:at + 9], "big") & 0x7FFFFFFF
        seen.append((kind, flags, stream))
        if stream and flags & 1 and kind in (0, 1):
            conn.sendall(struct.pack(">I", 1)[1:] + bytes([1, 5]) + struct.pack(">I", stream) + b"\\x88")
        at += 9 + length
print(json.dumps({"seconds": time.monotonic() - start, "frames": seen}), flush=True)
"""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


@pytest.fixture
def guarded(shim):
    """A stand-in behind the guard on a public gRPC port: (port, the process)."""
    (port,) = free_ports(1)
    env = {
        **os.environ,
        "LD_PRELOAD": str(shim),
        "TRITON_GUARD_H2_PORTS": str(port),
        "TRITON_GUARD_H2_PUBLIC": str(port),
    }
    env["TRITON_GUARD_FRONT_LIMITS"] = LIMITS
    process = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout.readline() == b"listening\n"
    yield port, process
    if process.poll() is None:  # stopped by the test that started it
        process.kill()
    process.communicate()


def ended_within(client: socket.socket, seconds: float) -> float | None:
    """Seconds until the guard closed the client's connection (reading and dropping what comes), or None."""
    start = time.monotonic()
    client.settimeout(0.1)
    while time.monotonic() - start < seconds:
        try:
            if client.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start
    return None


def program_saw(process) -> dict:
    out, err = process.communicate(timeout=20)
    seen = json.loads(out.decode().splitlines()[-1])
    return {"seconds": seen["seconds"], "frames": [tuple(f) for f in seen["frames"]], "log": err.decode()}


def test_a_stream_with_headers_and_no_message_loses_its_connection_at_the_head_deadline(guarded):
    port, process = guarded
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, INFER))
        took = ended_within(client, 8)
    assert took is not None and HEAD_MS / 1000 - 0.3 < took < HEAD_MS / 1000 + 3, took
    seen = program_saw(process)
    # the program's call ended as a hung-up client's calls end (END_STREAM), never reset, and its answer was dropped
    assert (DATA, END_STREAM, 1) in seen["frames"] and not [f for f in seen["frames"] if f[0] == 3]
    assert "did not come within its deadline" in seen["log"]


def test_a_frame_trickled_a_byte_at_a_time_loses_its_connection_at_the_head_deadline(guarded):
    port, process = guarded
    settings = frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535) * 2)  # held whole before the program reads it
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(PREFACE + settings[:10])
        start, took = time.monotonic(), None
        for byte in settings[10:]:  # 11 more bytes, one every 0.4 s: 4.4 s, past the 1 s deadline
            time.sleep(0.4)
            try:
                client.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                took = time.monotonic() - start
                break
        took = took if took is not None else ended_within(client, 3)
    assert took is not None and took < HEAD_MS / 1000 + 3, took
    assert (SETTINGS, 0, 0) not in program_saw(process)["frames"]  # never handed out: it never came whole in time


def test_a_connection_with_nothing_pending_stays_open_past_the_deadline(guarded):
    port, process = guarded
    call = frame(HEADERS, END_HEADERS, 1, INFER) + frame(DATA, END_STREAM, 1, message(b"\x0a\x01x"))
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(PREFACE + frame(SETTINGS, 0, 0) + call)
        client.settimeout(3)
        answer = client.recv(65536)  # the program's answer to the call
        assert answer[3] == HEADERS and answer[4] & END_STREAM
        assert ended_within(client, 2.5 * HEAD_MS / 1000) is None  # idle, nothing due: not closed
        client.sendall(frame(HEADERS, END_HEADERS, 3, INFER) + frame(DATA, END_STREAM, 3, message(b"\x0a\x01y")))
        assert client.recv(65536)[8] == 3  # a second call on the same connection is answered
    seen = program_saw(process)
    assert (DATA, END_STREAM, 1) in seen["frames"] and (DATA, END_STREAM, 3) in seen["frames"]
    assert "deadline" not in seen["log"]


# Accepts every connection on argv[1] and reads each until its end, answering nothing: a call it is handed runs for
# as long as the test lasts.
HOLDER = """
import socket, sys, threading
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen(64); print("listening", flush=True)
def read(conn):
    while conn.recv(65536):
        pass
while True:
    threading.Thread(target=read, args=(server.accept()[0],), daemon=True).start()
"""


def test_the_grpc_port_s_connection_cap_closes_the_idlest_never_one_whose_call_runs(shim):
    """At the cap (TRITON_GUARD_FRONT_LIMITS' third figure, 4 here) a new connection takes the slot of the one idle the
    longest; where every connection has a call running, the newcomer is the one closed."""
    (port,) = free_ports(1)
    env = {
        **os.environ,
        "LD_PRELOAD": str(shim),
        "TRITON_GUARD_H2_PORTS": str(port),
        "TRITON_GUARD_H2_PUBLIC": str(port),
    }
    env["TRITON_GUARD_FRONT_LIMITS"] = f"{64 << 20},16384,4,{1 << 30},10000"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(port)], env=env, stdout=subprocess.PIPE)
    clients = []
    try:
        assert process.stdout.readline() == b"listening\n"
        for _ in range(4):
            clients.append(socket.create_connection(("127.0.0.1", port)))
            clients[-1].sendall(PREFACE + frame(SETTINGS, 0, 0))
            time.sleep(0.05)
        clients.append(socket.create_connection(("127.0.0.1", port)))  # the fifth: the first, idle longest, goes
        clients[-1].sendall(PREFACE + frame(SETTINGS, 0, 0))
        assert ended_within(clients[0], 3) is not None
        assert all(ended_within(c, 0.3) is None for c in clients[1:])
        call = frame(HEADERS, END_HEADERS, 1, INFER) + frame(DATA, END_STREAM, 1, message(b"\x0a\x01x"))
        for client in clients[1:]:  # every slot now holds a call the program runs (it never answers)
            client.sendall(call)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port)) as newcomer:
            assert ended_within(newcomer, 3) is not None  # refused: no slot is idle
        assert all(ended_within(c, 0.3) is None for c in clients[1:])  # no running call lost its connection
    finally:
        for client in clients:
            client.close()
        process.kill()
        process.wait()
