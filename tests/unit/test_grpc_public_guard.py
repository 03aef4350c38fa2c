"""The guard on a gRPC port clients reach directly (TRITON_GUARD_H2_PUBLIC, `server start --checks-in-server`),
loaded into a stand-in program: a client's deadline (grpc-timeout) reaches the program renamed, however it was
HPACK-coded and split, with every other header as sent; a frame that would make gRPC reset a running call is
never read, nor anything after it; the connection of a client that hangs up or is cut ends for the program only
once it has ended every call of it. A real HPACK decoder (hpack) reads what the program read."""

import os
import socket
import struct
import subprocess
import sys
import time

import pytest
from hpack import Decoder, Encoder
from hypothesis import given, settings
from hypothesis import strategies as st

from tpserve.common.endpoints import free_ports

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20
DATA, HEADERS, PRIORITY_FRAME, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

# accepts one connection on the port in argv[1], reads argv[4] bytes at a time (waiting on EAGAIN) until the
# peer's end; once it has read argv[2] bytes (or, where argv[2] is -1, once it read nothing new for 0.5 s: the
# client gone or cut), it writes argv[3] (hex) as its own frames. Prints what it read.
STAND_IN = """
import select, socket, sys, time
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen(8); print("listening", flush=True)
conn, _ = server.accept(); conn.setblocking(False)
steps = [(int(a), bytes.fromhex(w)) for a, w in zip(sys.argv[2].split(","), sys.argv[3].split(","))]
read, last = b"", time.monotonic()
while True:
    after = steps[0][0] if steps else None
    quiet = read and time.monotonic() - last > 0.5
    if after is not None and ((after >= 0 and len(read) >= after) or (after < 0 and quiet)):
        conn.sendall(steps.pop(0)[1]); continue
    select.select([conn], [], [], 0.1)
    try:
        chunk = conn.recv(int(sys.argv[4]))
    except BlockingIOError:
        time.sleep(0.01)
        continue
    except ConnectionResetError:  # the peer's end, as the program would see it
        break
    if not chunk:
        break
    read, last = read + chunk, time.monotonic()
sys.stdout.buffer.write(read)
"""
TRAILERS = b"\x88"  # :status 200, indexed: the server's end of a stream


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame after the preface."""
    found, at = [], len(PREFACE)
    while at < len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        kind, flags = data[at + 3], data[at + 4]
        stream = int.from_bytes(data[at + 5 : at + 9], "big") & 0x7FFFFFFF
        found.append((kind, flags, stream, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return found


def ends(streams) -> bytes:
    """The server's end of each stream (trailers with END_STREAM)."""
    return b"".join(frame(HEADERS, END_HEADERS | END_STREAM, s, TRAILERS) for s in streams)


def through_guard(shim, pieces: list[bytes], writes, after: int = -1, read_size: int = 65536):
    """What the stand-in read of pieces sent one by one (and whether it saw the end), on a public gRPC port. writes:
    what the stand-in writes once it has read `after` bytes (-1: once the reads pause), or a list of (after, bytes)
    steps written in turn."""
    steps = writes if isinstance(writes, list) else [(after, writes)]
    after, writes = ",".join(str(a) for a, _ in steps), ",".join(w.hex() for _, w in steps)
    (port,) = free_ports(1)
    env = {**os.environ, "LD_PRELOAD": str(shim), "TRITON_GUARD_H2_PORTS": str(port)}
    env["TRITON_GUARD_H2_PUBLIC"] = str(port)
    env["TRITON_GUARD_STREAMING"] = "1"  # streams served: what the guard does to their messages (refusal: below)
    command = [sys.executable, "-c", STAND_IN, str(port), after, writes, str(read_size)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)
    assert process.stdout.readline() == b"listening\n"
    with socket.create_connection(("127.0.0.1", port)) as client:
        for piece in pieces:
            client.sendall(piece)
            time.sleep(0.01)
    try:
        out, _ = process.communicate(timeout=30)
    finally:  # a stand-in that never saw its end is stopped by the test that started it
        if process.poll() is None:
            process.kill()
            process.wait()
    return out


def block_frames(stream: int, block: bytes, cuts: list[int], priority: bool, flags: int = END_STREAM) -> bytes:
    """block as a HEADERS frame (with a priority where asked: gRPC takes one, never padding) and CONTINUATION
    frames, split at cuts."""
    edges = [0, *sorted({c for c in cuts if 0 < c < len(block)}), len(block)]
    parts = [block[a:b] for a, b in zip(edges, edges[1:])]
    last = len(parts) - 1
    head_flags = flags | (END_HEADERS if last == 0 else 0)
    first = parts[0]
    if priority:
        first, head_flags = bytes(5) + first, head_flags | PRIORITY
    out = frame(HEADERS, head_flags, stream, first)
    for i, part in enumerate(parts[1:], start=1):
        out += frame(CONTINUATION, END_HEADERS if i == last else 0, stream, part)
    return out


def read_blocks(data: bytes) -> list[list[tuple[str, str]]]:
    """Each header block the program read, decoded (padding and priority taken off)."""
    decoder, blocks, pending = Decoder(), [], b""
    for kind, flags, _, payload in frames(data):
        if kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY:
                payload = payload[5:]
            pending = payload
        elif kind == CONTINUATION:
            pending += payload
        else:
            continue
        if flags & END_HEADERS:
            blocks.append(
                [(k.decode() if isinstance(k, bytes) else k, v) for k, v in decoder.decode(pending, raw=False)]
            )
    return blocks


HEADER_NAMES = st.sampled_from(
    [":path", "content-type", "te", "grpc-timeout", "user-agent", "x-grpc-timeout", "grpc-timeou"]
)
HEADER = st.tuples(HEADER_NAMES, st.text("0123456789mSHu", min_size=1, max_size=9))


@settings(max_examples=15, deadline=None)
@given(
    blocks=st.lists(st.lists(HEADER, min_size=1, max_size=6), min_size=1, max_size=4),
    huffman=st.booleans(),
    sensitive=st.booleans(),
    priority=st.booleans(),
    cuts=st.lists(st.integers(1, 60), max_size=3),
    split=st.integers(1, 40),
)
def test_a_deadline_reaches_grpc_renamed_and_every_other_header_as_sent(
    shim, blocks, huffman, sensitive, priority, cuts, split
):
    encoder = Encoder()
    sent = PREFACE + frame(SETTINGS, 0, 0)
    for i, headers in enumerate(blocks):
        block = (
            encoder.encode(headers, huffman=huffman)
            if not sensitive
            else encoder.encode([(k, v, True) for k, v in headers], huffman=huffman)
        )
        sent += block_frames(1 + 2 * i, block, cuts, priority)
    pieces = [sent[i : i + split] for i in range(0, len(sent), split)]
    read = read_blocks(through_guard(shim, pieces, ends(range(1, 2 * len(blocks), 2)), len(sent)))
    expected = [[("grpc-timeous" if k == "grpc-timeout" else k, v) for k, v in headers] for headers in blocks]
    assert read == expected


def test_a_frame_that_would_reset_a_running_call_is_never_read_and_the_end_waits_for_the_call(shim):
    call = frame(HEADERS, END_HEADERS, 1, b"\x83\x86") + frame(DATA, END_STREAM, 1, b"\0\0\0\0\x01x")
    opened = frame(HEADERS, END_HEADERS, 3, b"\x83\x86")  # a stream the client leaves open
    again = frame(DATA, 0, 1, b"\0\0\0\0\x01y")  # after its END_STREAM: gRPC would reset the call
    sent = PREFACE + frame(SETTINGS, 0, 0) + call + opened
    later = again + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 9))
    read = through_guard(shim, [sent, later], ends([1, 3]), len(sent) + 9)
    assert read[: len(sent)] == sent
    assert frames(read)[len(frames(sent)) :] == [(DATA, END_STREAM, 3, b"")]  # the open stream ended, nothing else


def test_a_client_that_hangs_up_is_seen_gone_only_once_its_calls_ended(shim):
    call = frame(HEADERS, END_HEADERS, 1, b"\x83\x86") + frame(DATA, END_STREAM, 1, b"\0\0\0\0\x01x")
    sent = PREFACE + frame(SETTINGS, 0, 0) + call
    answer = frame(HEADERS, END_HEADERS, 1, b"\x88") + frame(DATA, 0, 1, b"\0\0\0\0\x02ok")
    read = through_guard(shim, [sent], answer + ends([1]))  # written once the client is gone (0.5 s quiet)
    after = frames(read)[len(frames(sent)) :]
    credit = struct.pack(">I", 7)  # the answer's DATA, credited back as if the client had read it
    assert read[: len(sent)] == sent and after == [(WINDOW_UPDATE, 0, 1, credit), (WINDOW_UPDATE, 0, 0, credit)]


def test_small_reads_take_the_ended_streams_over_several_reads(shim):
    opened = b"".join(frame(HEADERS, END_HEADERS, s, b"\x83\x86") for s in (1, 3, 5))
    sent = PREFACE + frame(SETTINGS, 0, 0) + opened
    read = through_guard(shim, [sent], ends([1, 3, 5]), len(sent) + 27, read_size=5)
    ended = sorted(frames(read)[len(frames(sent)) :], key=lambda f: f[2])  # in the order of the guard's table
    assert ended == [(DATA, END_STREAM, s, b"") for s in (1, 3, 5)]


@pytest.mark.parametrize("huffman", [False, True])
def test_a_name_that_only_starts_like_the_deadline_is_left_alone(shim, huffman):
    encoder = Encoder()
    headers = [("grpc-timeout-x", "1S"), ("grpc-timeouts", "2S"), ("grpc-timeout", "3S")]
    block = encoder.encode(headers, huffman=huffman)
    sent = PREFACE + frame(SETTINGS, 0, 0) + block_frames(1, block, [], False)
    read = read_blocks(through_guard(shim, [sent], ends([1]), len(sent)))
    assert read == [[("grpc-timeout-x", "1S"), ("grpc-timeouts", "2S"), ("grpc-timeous", "3S")]]


CALL = frame(HEADERS, END_HEADERS, 1, b"\x83\x86") + frame(DATA, END_STREAM, 1, b"\0\0\0\0\x01x")  # running
BREAKERS = {
    "DATA on stream 0": frame(DATA, 0, 0, b"x"),
    "DATA on a stream never opened": frame(DATA, 0, 9, b"x"),
    "HEADERS again on the running call": frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x88"),
    "HEADERS on an even stream": frame(HEADERS, END_HEADERS, 4, b"\x83"),
    "HEADERS reopening a closed stream": frame(HEADERS, END_HEADERS, 1, b"\x83"),
    "a reset of stream 0": frame(RST_STREAM, 0, 0, b"\0\0\0\x08"),
    "a reset of a stream never opened": frame(RST_STREAM, 0, 7, b"\0\0\0\x08"),
    "a reset of 5 bytes": frame(RST_STREAM, 0, 1, b"\0\0\0\x08\0"),
    "SETTINGS on a stream": frame(SETTINGS, 0, 1, b""),
    "SETTINGS of 5 bytes": frame(SETTINGS, 0, 0, b"\0\x04\0\0\0"),
    "a SETTINGS ACK with a payload": frame(SETTINGS, 0x1, 0, b"\0\x04\0\0\0\x01"),
    "a PUSH_PROMISE": frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\x02\x82"),
    "PING of 7 bytes": frame(PING, 0, 0, b"1234567"),
    "PING on a stream": frame(PING, 0, 1, b"12345678"),
    "GOAWAY of 4 bytes": frame(GOAWAY, 0, 0, b"\0\0\0\x01"),
    "WINDOW_UPDATE of 5 bytes": frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\x01\0"),
    "WINDOW_UPDATE on a stream never opened": frame(WINDOW_UPDATE, 0, 11, b"\0\0\0\x01"),
    "PRIORITY of 4 bytes": frame(PRIORITY_FRAME, 0, 3, b"\0\0\0\x01"),
    "a CONTINUATION outside a header block": frame(CONTINUATION, END_HEADERS, 1, b"\x82"),
    "another frame inside a header block": frame(HEADERS, 0, 3, b"\x83") + frame(PING, 0, 0, b"12345678"),
    "a frame longer than the server allows": frame(DATA, 0, 0, b"x" * 16385),
    "a WINDOW_UPDATE of 0 on the connection": frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"),
    "a WINDOW_UPDATE of 0 on the running call": frame(WINDOW_UPDATE, 0, 1, b"\0\0\0\0"),
    "a WINDOW_UPDATE past 2^31-1": frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 65535)),
    "SETTINGS_ENABLE_PUSH of 2": frame(SETTINGS, 0, 0, struct.pack(">HI", 2, 2)),
    "SETTINGS_INITIAL_WINDOW_SIZE of 2^31": frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 2**31)),
    "SETTINGS_MAX_FRAME_SIZE of 100": frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 100)),
    "SETTINGS of 17 entries": frame(SETTINGS, 0, 0, struct.pack(">HI", 3, 100) * 17),
    "an initial window that takes a stream's past 2^31-1": frame(
        WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1 - 65535)
    )
    + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65536)),
}
OPENED = frame(HEADERS, END_HEADERS, 3, b"\x83")  # a stream the client keeps open
BREAKERS.update(
    {
        "DATA whose padding fills it": OPENED + frame(DATA, PADDED, 3, b"\x05abcd"),
        "DATA padded with no payload": OPENED + frame(DATA, PADDED, 3, b""),
        "HEADERS whose padding and priority outrun it": frame(
            HEADERS, END_HEADERS | PADDED | PRIORITY, 3, b"\x01" + bytes(5)
        ),
        "a padded HEADERS (gRPC ends the connection, even for 0 bytes of padding)": frame(
            HEADERS, END_HEADERS | END_STREAM | PADDED, 3, b"\0\x83\x86"
        ),
        "a PRIORITY on itself": frame(PRIORITY_FRAME, 0, 1, struct.pack(">IB", 1, 16)),
        "trailers that depend on themselves": OPENED
        + frame(HEADERS, END_HEADERS | END_STREAM | PRIORITY, 3, struct.pack(">IB", 3, 16) + b"\x88"),
    }
)
BREAKERS.update(  # header blocks gRPC's HPACK decoder would fail on: the connection would end
    {
        f"a header block with {name}": frame(HEADERS, END_HEADERS | END_STREAM, 3, block)
        for name, block in {
            "an index past both tables": b"\xbe",
            "an index of 0": b"\x80",
            "an integer past 2^31": b"\xff\xff\xff\xff\xff\xff\x0f",
            "a table size past 4096": b"\x3f\xe9\x26",
            "a Huffman string holding EOS": b"\x40\x84\xff\xff\xff\xff\x01a",
            "a size update after a field": b"\x83\x3f\xe1\x1f\x86",
            "three size updates": b"\x20\x20\x20\x83\x86",
            "Huffman padding of zeros": b"\x40\x81\x00\x01a",
            "a string running past the block": b"\x40\x05ab",
            "a name indexed past the tables": b"\x7f\x10\x01a",
        }.items()
    }
)
BREAKERS["a header block split over CONTINUATIONs, bad in the last"] = (
    frame(HEADERS, 0, 3, b"\x82") + frame(CONTINUATION, 0, 3, b"\x86") + frame(CONTINUATION, END_HEADERS, 3, b"\xbe")
)
KEPT = {  # what of the case is read before the frame that is cut
    "DATA whose padding fills it": OPENED,
    "DATA padded with no payload": OPENED,
    "trailers that depend on themselves": OPENED,
    "another frame inside a header block": frame(HEADERS, 0, 3, b"\x83"),
    "an initial window that takes a stream's past 2^31-1": frame(
        WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1 - 65535)
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKERS))
def test_a_frame_that_would_end_the_connection_is_never_read(shim, case):
    sent = PREFACE + frame(SETTINGS, 0, 0) + CALL
    bad, kept = BREAKERS[case], KEPT.get(case, b"")
    block, opened = case == "another frame inside a header block", KEPT.get(case) == OPENED
    read = through_guard(shim, [sent, bad + frame(PING, 0, 0, b"abcdefgh")], ends([1, 3] if block or opened else [1]))
    # a header block cut between representations is ended (an empty CONTINUATION), then its stream; a stream the
    # client left open is ended for the server
    ended = frame(CONTINUATION, END_HEADERS, 3) + frame(DATA, END_STREAM, 3) if block else b""
    ended += frame(DATA, END_STREAM, 3) if opened else b""
    assert read == sent + kept + ended


def test_data_past_the_window_the_server_announced_is_never_read(shim):
    opened = frame(HEADERS, END_HEADERS, 3, b"\x83\x86")  # the server announced nothing: 65,535 bytes of window
    sent = PREFACE + frame(SETTINGS, 0, 0) + CALL + opened + frame(DATA, 0, 3, b"x" * 6)
    left = 65535 - 12  # the call's message and the first DATA spent the connection's window (shared by streams)
    fits = b"".join(frame(DATA, 0, 3, b"x" * 16384) for _ in range(3)) + frame(DATA, 0, 3, b"x" * (left - 3 * 16384))
    read = through_guard(shim, [sent, fits, frame(DATA, 0, 3, b"x")], ends([1, 3]))
    assert read == sent + fits + frame(DATA, END_STREAM, 3)


def test_a_reset_that_gRPC_would_read_as_data_past_the_window_is_never_read(shim):
    """A reset of an open stream reaches gRPC as a padded DATA of 4 bytes: with the window spent, it is cut."""
    opened = frame(HEADERS, END_HEADERS, 3, b"\x83\x86")
    sent = PREFACE + frame(SETTINGS, 0, 0) + CALL + opened
    left = 65535 - 6
    fits = b"".join(frame(DATA, 0, 3, b"x" * 16384) for _ in range(3)) + frame(DATA, 0, 3, b"x" * (left - 3 * 16384))
    read = through_guard(shim, [sent, fits, frame(RST_STREAM, 0, 3, b"\0\0\0\x08")], ends([1, 3]))
    assert read == sent + fits + frame(DATA, END_STREAM, 3)


@pytest.mark.parametrize("acknowledged", [True, False])
def test_the_windows_the_server_announces_let_the_client_send_more(shim, acknowledged):
    """The server grants 1 MiB windows (its SETTINGS for each stream, a WINDOW_UPDATE for the connection) while
    stream 1 is open: 128 KiB on it is read once the client has acknowledged the SETTINGS. Unacknowledged, the
    stream's window is still 65,535 for gRPC, so the frame that passes it is never read (gRPC would end the
    connection, cancelling its calls): the connection counts as hung up, and its open call is ended for gRPC as a
    client's half-close would end it. The stand-in ends the stream only after that, so its window is in force."""
    opened = PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, b"\x83\x86")
    big = b"".join(frame(DATA, 0, 1, b"x" * 16384) for _ in range(8))  # 128 KiB: past 65,535 without the server's
    grant = frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20)) + frame(
        WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)
    )
    ack = frame(SETTINGS, 0x1, 0) if acknowledged else b""
    rest = ack + big + frame(DATA, END_STREAM, 1, b"")
    whole = opened + rest
    steps = [(len(opened), grant), (len(whole) if acknowledged else -1, ends([1]))]
    read = through_guard(shim, [opened, rest], steps)
    assert read == (whole if acknowledged else opened + big[: 3 * (9 + 16384)] + frame(DATA, END_STREAM, 1, b""))


@pytest.mark.parametrize("acknowledged", [False, True])
def test_a_frame_past_16_kib_is_read_only_once_the_client_acknowledged_the_servers_larger_frames(shim, acknowledged):
    """gRPC announces 4 MiB frames but holds a client to 16 KiB until the client's SETTINGS ACK (RFC 7540 6.5.3).
    A client that never acknowledged and sent a larger frame made gRPC end the connection and cancel its calls,
    which crashed tritonserver 2.51 about every 20 s under a storm of such clients: the guard cuts that frame."""
    sent = PREFACE + frame(SETTINGS, 0, 0) + CALL
    larger = frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 4 << 20))
    ack = frame(SETTINGS, 0x1, 0) if acknowledged else b""
    big = frame(0xFA, 0, 0, b"x" * 20000)  # a type gRPC ignores, of a size it checks all the same
    read = through_guard(shim, [sent, ack + big], larger + ends([1]), len(sent))
    assert read == (sent + ack + big if acknowledged else sent)


def test_a_header_block_cut_inside_a_representation_is_left_unended_and_makes_no_call(shim):
    sent = PREFACE + frame(SETTINGS, 0, 0) + CALL + frame(HEADERS, 0, 3, b"\x83\x40\x05ab")  # inside a name
    read = through_guard(shim, [sent, frame(PING, 0, 0, b"1234567")], ends([1]))  # only the call's end awaited
    assert read == sent


def test_frames_a_client_may_send_are_all_read(shim):
    block = Encoder().encode([(":path", "/x")])
    sent = (
        PREFACE + frame(SETTINGS, 0, 0, b"\0\x04\0\x10\0\0") + frame(SETTINGS, 0x1, 0) + frame(PING, 0, 0, b"12345678")
    )
    sent += (
        frame(HEADERS, 0, 1, block[:1])
        + frame(CONTINUATION, 0, 1, block[1:2])
        + frame(CONTINUATION, END_HEADERS, 1, block[2:])
    )
    sent += (
        frame(DATA, 0, 1, b"abc")
        + frame(WINDOW_UPDATE, 0, 1, b"\0\0\x01\0")
        + frame(PRIORITY_FRAME, 0, 1, b"\0\0\0\0\x10")
    )
    sent += frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x40\x01a\x01b") + frame(0x42, 0, 0, b"unknown")  # trailers
    sent += frame(HEADERS, END_HEADERS | PRIORITY, 3, struct.pack(">IB", 1, 16) + b"\x83")
    sent += frame(DATA, PADDED | END_STREAM, 3, b"\x02ab\0\0") + frame(PRIORITY_FRAME, 0, 5, struct.pack(">IB", 3, 16))
    sent += frame(WINDOW_UPDATE, 0, 0, b"\0\0\x01\0")
    goaway = frame(GOAWAY, 0, 0, b"\0\0\0\x01\0\0\0\0")  # read as a frame of a type the server ignores
    ignored = goaway[:3] + bytes([0xFA]) + goaway[4:]
    ping = frame(PING, 0, 0, b"12345678")  # answered by the guard, read as ignored too
    expected = sent.replace(ping, ping[:3] + bytes([0xFA]) + ping[4:])
    assert through_guard(shim, [sent + goaway], ends([1, 3]), len(sent)) == expected + ignored
    pieces = [sent[i : i + 3] for i in range(0, len(sent), 3)]  # control frames split, read whole by the guard
    assert through_guard(shim, pieces, ends([1, 3]), len(sent), read_size=7) == expected


def served(shim, sent, writes, after: int, waiting: int, listen_s: float = 1.0, **more: str):
    """(what the stand-in read, what the client got back) of sent (bytes, or pieces sent 0.1 s apart) on a public
    port with a waiting bound; writes as through_guard's."""
    steps = writes if isinstance(writes, list) else [(after, writes)]
    after, writes = ",".join(str(a) for a, _ in steps), ",".join(w.hex() for _, w in steps)
    (port,) = free_ports(1)
    env = {**os.environ, "LD_PRELOAD": str(shim), "TRITON_GUARD_H2_PORTS": str(port)}
    env.update(TRITON_GUARD_H2_PUBLIC=str(port), TRITON_GUARD_MAX_WAITING=str(waiting), **more)
    command = [sys.executable, "-c", STAND_IN, str(port), after, writes, "65536"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)
    got = b""
    try:
        assert process.stdout.readline() == b"listening\n"
        with socket.create_connection(("127.0.0.1", port)) as client:
            for piece in sent if isinstance(sent, list) else [sent]:
                client.sendall(piece)
                time.sleep(0.1)
            client.settimeout(0.1)
            until = time.monotonic() + listen_s
            while time.monotonic() < until:
                try:
                    chunk = client.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                got += chunk
        out, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return out, got


def answers(got: bytes) -> list[tuple[int, int, int, object]]:
    """The frames the client got: header blocks decoded (as a dict), other payloads as they came."""
    decoder, found = Decoder(), []
    for kind, flags, stream, payload in frames(PREFACE + got):
        found.append((kind, flags, stream, dict(decoder.decode(payload, raw=False)) if kind == HEADERS else payload))
    return found


def call(stream: int, path: str, message: bytes) -> bytes:
    block = Encoder().encode([(":method", "POST"), (":path", path), ("content-type", "application/grpc")])
    return frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, message)


SERVICE = "/inference.GRPCInferenceService/"
MODEL_INFER, STREAM_INFER, METADATA = SERVICE + "ModelInfer", SERVICE + "ModelStreamInfer", SERVICE + "ModelMetadata"
MESSAGE = b"\0\0\0\0\x0f\x0a\x0dacme_scorer_x"  # a gRPC message (20 bytes with its prefix): model_name only


def test_a_call_past_the_waiting_bound_is_refused_before_grpc_has_its_message(shim):
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, MESSAGE) + call(3, MODEL_INFER, MESSAGE)
    read, got = served(shim, sent, ends([1]), len(sent), waiting=1)
    program = frames(read)
    assert program[:4] == frames(sent)[:4]  # the first call, and the second's header block (HPACK stays in step)
    assert program[4] == (RST_STREAM, 0, 3, struct.pack(">I", 8))  # CANCEL: dropped inside gRPC, never run
    assert program[5] == (0xFA, 0, 0, MESSAGE[13:])  # the rest of its DATA, as a frame the server ignores
    assert len(read) == len(sent)  # byte for byte
    refusal, credit = answers(got)[:2]
    assert refusal[:3] == (HEADERS, END_STREAM | END_HEADERS, 3)
    assert refusal[3]["grpc-status"] == "14" and refusal[3]["grpc-retry-pushback-ms"] == "1000"
    assert "waiting bound" in refusal[3]["grpc-message"] and refusal[3][":status"] == "200"
    assert credit == (WINDOW_UPDATE, 0, 0, struct.pack(">I", len(MESSAGE)))  # the bytes the server never read
    assert answers(got)[2][:3] == (HEADERS, END_STREAM | END_HEADERS, 1)  # the first call's own answer


def test_calls_within_the_bound_and_calls_other_than_model_infer_are_never_refused(shim):
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, STREAM_INFER, MESSAGE) + call(3, STREAM_INFER, MESSAGE)
    sent += call(7, METADATA, MESSAGE)  # answered without waiting: never refused for load
    read, got = served(shim, sent, ends([1, 3, 7]), len(sent), waiting=1, listen_s=0.5, TRITON_GUARD_STREAMING="1")
    assert read == sent and not any("grpc-status" in f[3] for f in answers(got) if f[0] == HEADERS)
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, MESSAGE) + call(3, MODEL_INFER, MESSAGE)
    assert served(shim, sent, ends([1, 3]), len(sent), waiting=2, listen_s=0.3)[0] == sent


def test_streams_are_refused_at_their_first_message_unless_streaming_is_served(shim):
    """tritonserver 2.51 crashes under concurrent ModelStreamInfer streams (docs/security.md): off (the default), a
    stream's first DATA that carries bytes becomes a reset gRPC drops before any request of it runs, and the client
    gets UNIMPLEMENTED with the reason; an empty DATA first passes (no message yet). Unary calls pass."""
    opened = Encoder().encode([(":method", "POST"), (":path", STREAM_INFER), ("content-type", "application/grpc")])
    stream = frame(HEADERS, END_HEADERS, 3, opened) + frame(DATA, 0, 3) + frame(DATA, 0, 3, MESSAGE)
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, MESSAGE) + stream + call(5, STREAM_INFER, MESSAGE)
    read, got = served(shim, sent, ends([1]), len(sent), waiting=0)
    program = frames(read)
    assert program[:5] == frames(sent)[:5]  # the unary call, the stream's headers and its empty DATA
    assert program[5] == (RST_STREAM, 0, 3, struct.pack(">I", 8)) and program[6] == (0xFA, 0, 0, MESSAGE[13:])
    assert program[8][:3] == (RST_STREAM, 0, 5) and len(read) == len(sent)
    refusals = [f for f in answers(got) if f[0] == HEADERS and "grpc-status" in f[3] and f[2] in (3, 5)]
    assert [f[2] for f in refusals] == [3, 5]
    for _, flags, _, block in refusals:
        assert flags == END_STREAM | END_HEADERS and block["grpc-status"] == "12"  # UNIMPLEMENTED: not retried
        assert "ModelStreamInfer is not served" in block["grpc-message"] and "grpc-retry-pushback-ms" not in block
    served_read, _ = served(shim, sent, ends([1, 3, 5]), len(sent), waiting=0, TRITON_GUARD_STREAMING="1")
    assert served_read == sent


def test_a_stream_whose_first_message_is_too_short_to_refuse_cuts_the_connection(shim):
    """A first DATA under 13 bytes cannot become the refusal: gRPC reads up to it, and nothing more of the client."""
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, MESSAGE)
    opened = Encoder().encode([(":method", "POST"), (":path", STREAM_INFER), ("content-type", "application/grpc")])
    short = frame(HEADERS, END_HEADERS, 3, opened) + frame(DATA, 0, 3, b"\0\0\0\0\x02\x0a\x00")
    before = sent + frame(HEADERS, END_HEADERS, 3, opened)
    read, _ = served(shim, sent + short + call(5, MODEL_INFER, MESSAGE), ends([1, 3]), len(before), waiting=0)
    assert read == before + frame(DATA, END_STREAM, 3)  # the stream ended as a hung-up client's, then the end


def test_a_client_that_cancelled_what_the_server_still_runs_is_refused_new_calls(shim):
    """64 calls the server still runs that their client reset (orphans): that connection's next call is refused."""
    calls = b"".join(call(s, MODEL_INFER, MESSAGE) for s in range(1, 129, 2))
    resets = b"".join(frame(RST_STREAM, 0, s, struct.pack(">I", 8)) for s in range(1, 129, 2))
    sent = PREFACE + frame(SETTINGS, 0, 0) + calls + resets + call(129, MODEL_INFER, MESSAGE)
    read, got = served(shim, sent, ends(range(1, 131, 2)), len(sent), waiting=0)
    assert frames(read)[-2][:3] == (RST_STREAM, 0, 129)  # the new call, refused before gRPC had its message
    refusal = next(f for f in answers(got) if f[0] == HEADERS and f[2] == 129)
    assert refusal[3]["grpc-status"] == "14" and "clients cancelled" in refusal[3]["grpc-message"]


def test_a_model_its_supervisor_marked_over_its_queue_budget_is_refused(shim, tmp_path):
    """Admission by queue time: the model named in the message's first bytes, marked in the admission table."""
    from tpserve.server.edge import admission_table

    table = admission_table.make_table(tmp_path)
    region = admission_table.Region(table, 0)
    region.mark("acme_scorer_x", time.monotonic_ns() + 30 * 10**9, 5000.0)
    region.mark("another", 0, 0.0)
    other = b"\0\0\0\0\x09\x0a\x07another" + bytes(6)
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, MESSAGE) + call(3, MODEL_INFER, other)
    read, got = served(shim, sent, ends([3]), len(sent), waiting=0, TRITON_GUARD_ADMISSION=str(table))
    assert frames(read)[2][:3] == (RST_STREAM, 0, 1) and frames(read)[-1] == frames(sent)[-1]  # only the marked one
    refusal = answers(got)[0]
    assert refusal[:3] == (HEADERS, END_STREAM | END_HEADERS, 1) and "queue time" in refusal[3]["grpc-message"]
    assert region.refused("acme_scorer_x") == 1 and region.refused("another") == 0  # counted where the supervisor reads
    region.close()


def test_a_clients_pings_are_answered_by_the_guard_and_never_reach_grpc(shim):
    """gRPC ends a connection whose client pings too often ("too_many_pings"), cancelling its calls."""
    pings = b"".join(frame(PING, 0, 0, b"%08d" % k) for k in range(6)) + frame(PING, 0x1, 0, b"serverok")
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, MESSAGE) + pings
    read, got = served(shim, sent, ends([1]), len(sent), waiting=0, listen_s=0.5)
    seen = frames(read)
    assert [f[0] for f in seen[3:9]] == [0xFA] * 6 and seen[9] == (PING, 0x1, 0, b"serverok")  # an ACK passes
    acks = [f for f in answers(got) if f[0] == PING]
    assert acks == [(PING, 0x1, 0, b"%08d" % k) for k in range(6)]


def test_a_client_that_sends_settings_without_end_is_cut(shim):
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, MESSAGE)
    flood = frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535)) * 120  # each makes gRPC queue an ACK
    read = through_guard(shim, [sent, flood], ends([1]))
    assert read.startswith(sent) and len(frames(read)) == len(frames(sent)) + 99


def stream_call(stream: int, messages: list[bytes], end: bool = False) -> bytes:
    """A ModelStreamInfer stream's headers and its messages, one DATA frame each."""
    block = Encoder().encode([(":method", "POST"), (":path", STREAM_INFER), ("content-type", "application/grpc")])
    data = [frame(DATA, END_STREAM if end and i == len(messages) - 1 else 0, stream, m) for i, m in enumerate(messages)]
    return frame(HEADERS, END_HEADERS, stream, block) + b"".join(data)


def model_stream_message(name: str) -> bytes:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=name)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    body = request.SerializeToString()
    return b"\0" + struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("read_size", [65536, 7])
def test_a_stream_of_messages_tritonserver_can_read_passes_as_sent(shim, read_size):
    messages = [model_stream_message(name) for name in ("acme_scorer", "é", "")]
    split = messages[0][:9] + messages[1][:3], messages[1][3:] + messages[2]  # messages across frames
    sent = PREFACE + frame(SETTINGS, 0, 0) + stream_call(1, [*messages, *split], end=True)
    pieces = [sent[i : i + 11] for i in range(0, len(sent), 11)]
    assert through_guard(shim, pieces, ends([1]), len(sent), read_size=read_size) == sent


@pytest.mark.parametrize(
    "bad",
    [b"\0\0\0\0\x05\xff\xff\xff\xff\xff", b"\0\0\0\0\x04\x0a\x02\xc3\x28", b"\x01\0\0\0\x00"],
    ids=["not protobuf", "a name that is not UTF-8", "compressed"],
)
def test_a_stream_message_tritonserver_could_not_read_is_never_read(shim, bad):
    """gRPC would end the stream, cancelling its requests still running: the frame that ends the message is never
    read, and the stream ends as the connection's do, its message unfinished."""
    good = model_stream_message("acme_scorer")
    sent = PREFACE + frame(SETTINGS, 0, 0) + stream_call(1, [good, good])
    read = through_guard(shim, [sent, frame(DATA, 0, 1, bad[:3]), frame(DATA, 0, 1, bad[3:] + good)], ends([1]))
    assert read[: len(sent)] == sent
    rest = frames(read)[len(frames(sent)) :]
    assert rest[:1] == [(DATA, 0, 1, bad[:3])] and rest[-1] == (DATA, END_STREAM, 1, b"")  # the start, then the end
    assert len(rest) == 2


def test_a_client_that_resized_its_hpack_table_is_refused_with_a_reset(shim):
    """The server's next header block may have to begin with the size (RFC 7541 4.2): the guard writes no block of
    its own, and refuses with RST_STREAM REFUSED_STREAM (UNAVAILABLE at a gRPC client) instead. Announcing a table
    size exempts nobody from the bounds."""
    settings_frame = frame(SETTINGS, 0, 0, struct.pack(">HI", 1, 8192))
    sent = PREFACE + settings_frame + call(1, MODEL_INFER, MESSAGE) + call(3, MODEL_INFER, MESSAGE)
    read, got = served(shim, sent, ends([1]), len(sent), waiting=1, listen_s=0.5)
    assert frames(read)[4] == (RST_STREAM, 0, 3, struct.pack(">I", 8)) and len(read) == len(sent)
    assert answers(got)[:2] == [
        (RST_STREAM, 0, 3, struct.pack(">I", 7)),
        (WINDOW_UPDATE, 0, 0, struct.pack(">I", len(MESSAGE))),
    ]


def test_flags_a_frame_type_does_not_define_are_cleared_before_grpc_reads_them(shim):
    """tritonserver 2.51's gRPC ends a connection (and cancels its calls) for a SETTINGS, PING or WINDOW_UPDATE with
    a flag its type does not define; RFC 7540 has them ignored: they reach it cleared, on every known type."""
    sent = PREFACE + frame(SETTINGS, 0x2, 0) + call(1, MODEL_INFER, MESSAGE)
    odd = frame(WINDOW_UPDATE, 0x81, 0, b"\0\0\0\x09") + frame(SETTINGS, 0xFE, 0) + frame(0x42, 0xFF, 0, b"x")
    odd += frame(HEADERS, END_HEADERS | 0x2 | 0x80, 3, b"\x83\x86") + frame(DATA, END_STREAM | 0x2 | 0x20, 3, MESSAGE)
    read = through_guard(shim, [sent + odd], ends([1, 3]), len(sent) + len(odd))
    assert [(k, f) for k, f, _, _ in frames(read)] == [
        (SETTINGS, 0), (HEADERS, END_HEADERS), (DATA, END_STREAM),
        (WINDOW_UPDATE, 0), (SETTINGS, 0), (0x42, 0xFF), (HEADERS, END_HEADERS), (DATA, END_STREAM),
    ]  # fmt: skip


def test_a_stream_with_no_message_is_not_a_call_and_an_answered_call_no_longer_waits(shim):
    """The waiting bound counts a call from its client's end of its side (its message whole) until the server begins
    its answer: streams opened with HEADERS only, and calls whose answers a client never lets the server write (a
    window of 0), hold no place."""
    opened = b"".join(frame(HEADERS, END_HEADERS, s, Encoder().encode([(":path", MODEL_INFER)])) for s in (1, 3, 5))
    first = PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 0)) + opened + call(7, MODEL_INFER, MESSAGE)
    answer = frame(HEADERS, END_HEADERS, 7, b"\x88")  # its answer begun; its DATA the window holds up
    steps = [(len(first), answer), (-1, ends([1, 3, 5, 7, 9]))]  # once the client is gone: every stream ended
    read, got = served(shim, [first, call(9, MODEL_INFER, MESSAGE)], steps, 0, waiting=1)
    assert not any(f[0] == RST_STREAM for f in frames(read)), "a call was refused"
    assert not any(f[0] == HEADERS and "grpc-status" in f[3] for f in answers(got))


def test_a_client_gone_with_a_window_of_0_has_its_answers_written_and_dropped(shim):
    """A hung-up client that never opened its window leaves the server answers it cannot write: the guard opens the
    windows as the client would have (WINDOW_UPDATE), so that the calls end and the connection with them."""
    sent = PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 0)) + call(1, MODEL_INFER, MESSAGE)
    read = through_guard(shim, [sent], ends([1]))
    assert read[: len(sent)] == sent
    assert frames(read)[len(frames(sent)) :] == [(WINDOW_UPDATE, 0, 1, struct.pack(">I", 65535))]


def test_a_message_over_the_edges_limit_is_refused_before_grpc_holds_it(shim):
    """gRPC messages are held to --max-request-mb as HTTP bodies are (the prefix says the length): RESOURCE_EXHAUSTED.
    A call whose first DATA cannot hold the prefix is one no gRPC client sends: never read."""
    long = b"\0" + struct.pack(">I", 10**6) + MESSAGE[5:]
    sent = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, long)
    read, got = served(
        shim, sent, ends([]), len(sent), waiting=0, listen_s=0.5, TRITON_GUARD_FRONT_LIMITS="1000,16384,64"
    )
    assert frames(read)[2][:3] == (RST_STREAM, 0, 1)
    refusal = answers(got)[0][3]
    assert refusal["grpc-status"] == "8" and "over the edge's limit" in refusal["grpc-message"]
    short = PREFACE + frame(SETTINGS, 0, 0) + call(1, MODEL_INFER, b"\0\0\0")
    read, _ = served(shim, short, [(-1, ends([1]))], 0, waiting=0, listen_s=0.5)  # ended once the client is gone
    assert frames(read)[-1] == (DATA, END_STREAM, 1, b"")  # the call ended as a hung-up client's: no message


def test_a_connection_with_too_many_streams_whose_message_is_still_to_come_is_cut(shim):
    block = Encoder().encode([(":path", MODEL_INFER)])
    opened = b"".join(frame(HEADERS, END_HEADERS, s, block if s == 1 else b"\xbe") for s in range(1, 259, 2))
    read = through_guard(shim, [PREFACE + frame(SETTINGS, 0, 0) + opened], ends(range(1, 259, 2)))
    streams = [f[2] for f in frames(read) if f[0] == HEADERS]
    assert len(streams) == 128  # the 129th is never read; the 128 end as a hung-up client's do


def test_the_guards_hpack_tables_are_rfc_7541s():
    """server/triton/front/hpack_tables.h holds the Huffman code and the static table's name lengths as the hpack
    package has them (regenerate it from there if this fails)."""
    import re
    from pathlib import Path

    from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
    from hpack.table import HeaderTable

    import tpserve.server.triton as triton

    text = (Path(triton.__file__).parent / "front" / "hpack_tables.h").read_text()

    def array(name: str) -> list[int]:
        body = re.search(rf"{name}\[\d+\] = \{{(.*?)\}};", text, re.S).group(1)
        return [int(v, 0) for v in re.findall(r"0x[0-9a-f]+|\d+", body)]

    assert array("HUFFMAN_CODES") == list(REQUEST_CODES)
    assert array("HUFFMAN_BITS") == list(REQUEST_CODES_LENGTH)
    assert array("STATIC_NAME_LENGTH") == [0] + [len(name) for name, _ in HeaderTable.STATIC_TABLE]
