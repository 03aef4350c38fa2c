"""A hostile gRPC client, frame by frame: each attack of the front issue as a function that runs for some seconds
against tritonserver's own gRPC port and returns how many connections it made. The tests hold that none of them
changes tritonserver's pid, and that ordinary clients are answered meanwhile (tests/functional/test_front_hostile.py).
"""

import random
import socket
import struct
import time
from collections.abc import Callable

import numpy as np

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def headers_of(path: str = "ModelInfer") -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/inference.GRPCInferenceService/{path}"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def infer_message(model: str, name: str, data: np.ndarray) -> bytes:
    """A ModelInfer request, gRPC-framed (a 5-byte prefix)."""
    import tritonclient.grpc.service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=list(data.shape))
    request.raw_input_contents.append(data.astype(np.float32).tobytes())
    body = request.SerializeToString()
    return b"\0" + len(body).to_bytes(4, "big") + body


class Caller:
    """One connection's frames: the preface, then calls on odd streams, HPACK-coded by a real encoder."""

    def __init__(self, model: str, name: str, data: np.ndarray, settings: bytes = b""):
        from hpack import Encoder

        self.encoder, self.next_stream = Encoder(), 1
        self.message = infer_message(model, name, data)
        self.opening = PREFACE + frame(SETTINGS, 0, 0, settings)

    def block(self, path: str = "ModelInfer") -> bytes:
        return self.encoder.encode(headers_of(path))

    def call(self, whole: bool = True) -> bytes:
        """A ModelInfer call on the next stream (headers only where whole is False)."""
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        out = frame(HEADERS, END_HEADERS, stream, self.block())
        return out + (frame(DATA, END_STREAM, stream, self.message) if whole else b"")


def connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def _hang_up(client: socket.socket) -> None:
    if random.random() < 0.5:  # a reset, not a FIN
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def call_then(
    port: int, seconds: float, bad: Callable[[Caller], bytes], data: np.ndarray, model: str, name: str
) -> int:
    """Connections that make a call, then at once (or a little later) send what bad makes: how many."""
    made, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        caller = Caller(model, name, data)
        try:
            client = connect(port)
        except OSError:  # a server restarting: the tests see its pid change
            time.sleep(0.2)
            continue
        try:
            client.sendall(caller.opening + caller.call() + (b"" if random.random() < 0.5 else caller.call()))
            time.sleep(random.random() * 0.0005)
            client.sendall(bad(caller))
            time.sleep(random.random() * 0.003)
        except OSError:
            pass  # cut by the front: as it may
        _hang_up(client)
        made += 1
    return made


def size_update_after_a_field(caller: Caller) -> bytes:
    """A header block with a dynamic-table size update after its first field."""
    stream, caller.next_stream = caller.next_stream, caller.next_stream + 2
    block = caller.block()
    return frame(HEADERS, END_HEADERS | END_STREAM, stream, block[:1] + b"\x3f\xe1\x1f" + block[1:])


def three_size_updates(caller: Caller) -> bytes:
    """A header block that starts with three dynamic-table size updates (gRPC takes two)."""
    stream, caller.next_stream = caller.next_stream, caller.next_stream + 2
    return frame(HEADERS, END_HEADERS | END_STREAM, stream, b"\x20\x20\x3f\xe1\x1f" + caller.block())


def padded_headers(caller: Caller) -> bytes:
    """A PADDED HEADERS frame with no padding."""
    stream, caller.next_stream = caller.next_stream, caller.next_stream + 2
    return frame(HEADERS, END_HEADERS | END_STREAM | PADDED, stream, b"\0" + caller.block())


def settings_unknown_flag(caller: Caller) -> bytes:
    return frame(SETTINGS, 0x2 | (random.randrange(64) << 2), 0, b"")


def window_update_unknown_flag(caller: Caller) -> bytes:
    return frame(WINDOW_UPDATE, 0x1 << random.randrange(8), 0, (1).to_bytes(4, "big"))


def unknown_flags_anywhere(caller: Caller) -> bytes:
    """A control or call frame with flag bits its type does not define."""
    stream, caller.next_stream = caller.next_stream, caller.next_stream + 2
    choice = random.randrange(5)
    if choice == 0:
        return frame(PING, 0xFE, 0, bytes(8))
    if choice == 1:
        return frame(RST_STREAM, 0xFF, 1, (8).to_bytes(4, "big"))
    if choice == 2:
        return frame(HEADERS, END_HEADERS | 0x2 | 0x10 | 0x40 | 0x80, stream, caller.block()) + frame(
            DATA, END_STREAM | 0x2 | 0x4 | 0x10 | 0x80, stream, caller.message
        )
    if choice == 3:
        block = caller.block()
        return frame(HEADERS, 0x2, stream, block[:3]) + frame(CONTINUATION, END_HEADERS | 0xFA, stream, block[3:])
    return frame(2, 0xFF, stream, bytes(5))  # PRIORITY


CRASHERS = {
    "size update after a field": size_update_after_a_field,
    "three size updates": three_size_updates,
    "padded HEADERS": padded_headers,
    "SETTINGS with an unknown flag": settings_unknown_flag,
    "WINDOW_UPDATE with an unknown flag": window_update_unknown_flag,
    "unknown flags on any frame": unknown_flags_anywhere,
}


def broken_continuation(port: int, seconds: float, data: np.ndarray, model: str, name: str) -> int:
    """A call on stream 1, then a HEADERS of 8-16 KiB without END_HEADERS on stream 3 sent in two parts, then a
    frame that is not its CONTINUATION (a SETTINGS ACK), then a hang-up: how many connections."""
    made, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        caller = Caller(model, name, data)
        filler = b"a" * random.randrange(8 * 1024, 16 * 1024)
        value = bytes([0x7F]) + _integer_rest(len(filler) - 127) + filler  # a literal value, its length 7-bit
        big = caller.block() + b"\x00\x09x-filling" + value
        head = frame(HEADERS, 0, 3, big)
        try:
            client = connect(port)
        except OSError:
            time.sleep(0.2)
            continue
        try:
            client.sendall(caller.opening + caller.call())
            cut = random.randrange(9, len(head))
            client.sendall(head[:cut])
            time.sleep(0.001)
            client.sendall(head[cut:] + frame(SETTINGS, ACK, 0))
            time.sleep(random.random() * 0.003)
        except OSError:
            pass
        _hang_up(client)
        made += 1
    return made


def _integer_rest(value: int) -> bytes:
    """An HPACK integer's continuation bytes (the prefix already full)."""
    out = b""
    while value >= 128:
        out += bytes([(value & 0x7F) | 0x80])
        value >>= 7
    return out + bytes([value])


class Held:
    """Connections an attack holds open until close()."""

    def __init__(self):
        self.sockets: list[socket.socket] = []

    def close(self) -> None:
        for client in self.sockets:
            client.close()
        self.sockets.clear()


def window_zero(port: int, calls: int, data: np.ndarray, model: str, name: str, held: Held) -> None:
    """One connection that announces SETTINGS_INITIAL_WINDOW_SIZE=0 and sends `calls` ModelInfer calls: their
    answers can never be written."""
    caller = Caller(model, name, data, settings=struct.pack(">HI", 4, 0))
    client = connect(port)
    client.sendall(caller.opening + frame(SETTINGS, ACK, 0) + b"".join(caller.call() for _ in range(calls)))
    held.sockets.append(client)


def headers_only(port: int, calls: int, data: np.ndarray, model: str, name: str, held: Held) -> None:
    """One connection that opens `calls` ModelInfer streams with HEADERS only: no message, never half-closed."""
    caller = Caller(model, name, data)
    client = connect(port)
    client.sendall(caller.opening + frame(SETTINGS, ACK, 0) + b"".join(caller.call(whole=False) for _ in range(calls)))
    held.sockets.append(client)


def resized_table(port: int, calls: int, data: np.ndarray, model: str, name: str, held: Held) -> None:
    """One connection that announces SETTINGS_HEADER_TABLE_SIZE other than 4096, and sends `calls` calls."""
    caller = Caller(model, name, data, settings=struct.pack(">HI", 1, 8192))
    client = connect(port)
    client.sendall(caller.opening + frame(SETTINGS, ACK, 0) + b"".join(caller.call() for _ in range(calls)))
    held.sockets.append(client)


def answers_on(client: socket.socket, seconds: float) -> bytes:
    """What the server wrote on a held connection within some seconds (the frames' bytes)."""
    client.settimeout(0.2)
    got, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = client.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


def held_big_frames(port: int, connections: int, mib: int, held: Held) -> None:
    """Connections that each open a ModelStreamInfer stream and send all but the last byte of a DATA frame of `mib`
    MiB (the server's announced frame size permitting: what the front would have to hold whole)."""
    from hpack import Encoder

    size = mib * 1024 * 1024
    payload = b"\0" + (size - 5).to_bytes(4, "big") + bytes(size - 5)
    head = size.to_bytes(3, "big") + bytes([DATA, 0]) + (1).to_bytes(4, "big")
    block = Encoder().encode(headers_of("ModelStreamInfer"))
    for _ in range(connections):
        try:
            client = connect(port)
            client.sendall(PREFACE + frame(SETTINGS, 0, 0))
            client.recv(4096)  # the server's SETTINGS: acknowledged, its frame size is the client's to use
            client.sendall(frame(SETTINGS, ACK, 0) + frame(HEADERS, END_HEADERS, 1, block) + head + payload[:-1])
        except OSError:
            continue
        held.sockets.append(client)


def server_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each whole frame the server wrote."""
    found, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        if at + 9 + length > len(data):
            break
        stream = int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFFFFFF
        found.append((data[at + 3], data[at + 4], stream, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return found


def connection_failed(port: int, sent: bytes, seconds: float = 0.3) -> bool:
    """Whether the server ended the connection within some seconds of `sent` (a whole connection's bytes from the
    preface on, never ending it itself): tritonserver 2.51's gRPC closes a connection it cannot parse, with or
    without a GOAWAY, and cancels every call it runs (its crash)."""
    client = connect(port)
    try:
        client.sendall(sent)
        answers_on(client, seconds)
        client.settimeout(0.05)
        return client.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        client.close()
