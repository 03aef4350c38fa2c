"""The guard (server/triton/front/) for real, loaded into a stand-in program that listens as tritonserver does:
a connection of another user to an internal port is closed before the program reads a byte, and the HTTP/2 bytes
a program reads on a guarded gRPC port carry no RST_STREAM, each rewritten in place as the stream's state asks."""

import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from tpserve.common.endpoints import free_ports

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8
DATA, HEADERS, RST_STREAM, SETTINGS, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x8
CANCEL = struct.pack(">I", 8)

# accepts one connection on the port in argv[1] and writes every byte it read, until the peer closes
STAND_IN = """
import socket, sys
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen(8); print("listening", flush=True)
conn, _ = server.accept()
read = b""
while chunk := conn.recv(65536):
    read += chunk
sys.stdout.buffer.write(read)
"""

# as STAND_IN, and once it has read argv[2] bytes it writes the bytes of argv[3] (hex) as the server's own frames,
# then says so on stderr
STAND_IN_WRITES = """
import socket, sys
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen(8); print("listening", flush=True)
conn, _ = server.accept()
read, wrote = b"", False
while chunk := conn.recv(65536):
    read += chunk
    if not wrote and len(read) >= int(sys.argv[2]):
        conn.sendall(bytes.fromhex(sys.argv[3])); wrote = True
        sys.stderr.write("wrote\\n"); sys.stderr.flush()
sys.stdout.buffer.write(read)
"""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _stand_in(shim, port: int, **guard) -> subprocess.Popen:
    env = {**os.environ, "LD_PRELOAD": str(shim), **guard}
    process = subprocess.Popen([sys.executable, "-c", STAND_IN, str(port)], env=env, stdout=subprocess.PIPE)
    assert process.stdout.readline() == b"listening\n"
    return process


def _finish(process: subprocess.Popen, sent: bytes | None = None) -> tuple:
    """The stand-in's output once it ends; one that never ends is stopped by the test that started it."""
    try:
        return process.communicate(sent, timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _read_through_guard(shim, pieces: list[bytes]) -> bytes:
    (port,) = free_ports(1)
    process = _stand_in(shim, port, TRITON_GUARD_H2_PORTS=str(port))
    with socket.create_connection(("127.0.0.1", port)) as client:
        for piece in pieces:
            client.sendall(piece)
            time.sleep(0.02)
    out, _ = _finish(process)
    return out


def test_each_rst_stream_becomes_what_the_stream_state_allows(shim):
    look_alike = frame(RST_STREAM, 0, 1, CANCEL)  # inside a DATA payload: a message's bytes, never a frame
    sent = [
        PREFACE + frame(SETTINGS, 0, 0),
        frame(HEADERS, END_HEADERS, 1, b"\x82") + frame(RST_STREAM, 0, 1, CANCEL),  # open: a stream
        frame(HEADERS, END_HEADERS | END_STREAM, 3, b"\x82") + frame(RST_STREAM, 0, 3, CANCEL),  # half-closed
        frame(HEADERS, END_HEADERS, 5, b"\x82") + frame(DATA, END_STREAM, 5, look_alike),
        frame(RST_STREAM, 0, 5, CANCEL),
        frame(HEADERS, END_HEADERS, 7, b"\x82"),
    ]
    split = frame(RST_STREAM, 0, 7, CANCEL)
    out = _read_through_guard(shim, [*sent, split[:5], split[5:]])
    ended = frame(DATA, END_STREAM | PADDED, 1, b"\x03\x00\x00\x00")  # an empty DATA that half-closes the stream
    expected = [
        sent[0],
        frame(HEADERS, END_HEADERS, 1, b"\x82") + ended,
        frame(HEADERS, END_HEADERS | END_STREAM, 3, b"\x82") + frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", 1)),
        sent[3],
        frame(WINDOW_UPDATE, 0, 5, struct.pack(">I", 1)),
        sent[5],
        frame(DATA, END_STREAM | PADDED, 7, b"\x03\x00\x00\x00"),
    ]
    assert out == b"".join(expected)


def test_a_port_that_is_not_guarded_reads_every_byte_as_sent(shim):
    (port,) = free_ports(1)
    process = _stand_in(shim, port, TRITON_GUARD_H2_PORTS=str(port + 1 if port < 65535 else port - 1))
    sent = PREFACE + frame(HEADERS, END_HEADERS, 1, b"\x82") + frame(RST_STREAM, 0, 1, CANCEL)
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(sent)
    assert _finish(process)[0] == sent


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another local user (setpriv)")
def test_another_user_is_closed_before_the_program_reads_and_the_owner_gets_in(shim):
    (port,) = free_ports(1)
    process = _stand_in(shim, port, TRITON_GUARD_OWN_PORTS=str(port))
    script = (
        "import socket, sys\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        "s.sendall(b'from another user')\n"
        "try:\n    print(repr(s.recv(100)))\nexcept OSError as e:\n    print(type(e).__name__)\ns.close()\n"
    )
    other = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert other.stdout.strip() in ("b''", "ConnectionResetError"), other.stdout + other.stderr
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(b"from the owner")
    assert _finish(process)[0] == b"from the owner"


def test_streams_past_512_open_are_ended_as_the_first(shim):
    """The table of open streams has no cap a client can fill: the 601st stream's reset still ends it."""
    streams = list(range(1, 2 * 601, 2))
    opened = b"".join(frame(HEADERS, END_HEADERS, n, b"\x82") for n in streams)
    resets = b"".join(frame(RST_STREAM, 0, n, CANCEL) for n in streams)
    out = _read_through_guard(shim, [PREFACE + opened, resets])
    ended = b"".join(frame(DATA, END_STREAM | PADDED, n, b"\x03\x00\x00\x00") for n in streams)
    assert out == PREFACE + opened + ended


def test_a_stream_the_server_ended_leaves_the_table(shim):
    """A stream the server ended (its trailers) is no longer open: the peer's late reset becomes a WINDOW_UPDATE,
    never a DATA frame on a stream the server has closed."""
    (port,) = free_ports(1)
    opened = PREFACE + frame(HEADERS, END_HEADERS, 1, b"\x82") + frame(HEADERS, END_HEADERS, 3, b"\x82")
    server_frames = frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x88")
    env = {**os.environ, "LD_PRELOAD": str(shim), "TRITON_GUARD_H2_PORTS": str(port)}
    process = subprocess.Popen(
        [sys.executable, "-c", STAND_IN_WRITES, str(port), str(len(opened)), server_frames.hex()],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout.readline() == b"listening\n"
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(opened)
        assert process.stderr.readline() == b"wrote\n"
        assert client.recv(len(server_frames), socket.MSG_WAITALL) == server_frames
        client.sendall(frame(RST_STREAM, 0, 1, CANCEL) + frame(RST_STREAM, 0, 3, CANCEL))
    out, _ = _finish(process)
    assert out == opened + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1)) + frame(
        DATA, END_STREAM | PADDED, 3, b"\x03\x00\x00\x00"
    )


def test_a_split_frame_header_is_held_back_and_never_waited_for(shim):
    """A reset whose stream id arrives 300 ms after its first bytes: what came before it is read at once, and the
    reset is still rewritten as the stream's state asks once its header is whole."""
    (port,) = free_ports(1)
    env = {**os.environ, "LD_PRELOAD": str(shim), "TRITON_GUARD_H2_PORTS": str(port)}
    script = STAND_IN.replace("read += chunk", "read += chunk; sys.stderr.write(f'{len(read)}\\n'); sys.stderr.flush()")
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout.readline() == b"listening\n"
    opened = PREFACE + frame(HEADERS, END_HEADERS, 7, b"\x82")
    reset = frame(RST_STREAM, 0, 7, CANCEL)
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(opened + reset[:5])
        seen = int(process.stderr.readline())  # read before the rest is sent: the whole frames, not the 5 bytes
        time.sleep(0.3)
        client.sendall(reset[5:])
    out, _ = _finish(process)
    assert seen == len(opened)
    assert out == opened + frame(DATA, END_STREAM | PADDED, 7, b"\x03\x00\x00\x00")


# as STAND_IN_WRITES, then closes the connection, says "closed" on stderr and waits for a line on stdin
STAND_IN_CLOSES = """
import socket, sys
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen(8); print("listening", flush=True)
conn, _ = server.accept()
read, wrote = b"", False
while chunk := conn.recv(65536):
    read += chunk
    if not wrote and len(read) >= int(sys.argv[2]):
        conn.sendall(bytes.fromhex(sys.argv[3])); wrote = True
        sys.stderr.write("wrote\\n"); sys.stderr.flush()
conn.close()
sys.stderr.write("closed\\n"); sys.stderr.flush()
sys.stdin.readline()
"""


def _slot(path, slot: int) -> int:
    return struct.unpack_from("<Q", path.read_bytes(), slot * 64)[0]


def test_calls_the_peer_reset_that_the_server_still_runs_are_counted_in_its_backlog_slot(shim, tmp_path):
    """The edge's backlog (server/edge/cancel_notice.c reads it): a unary call the peer reset counts until the server
    ends it, and a closed connection takes its calls with it. The slot starts at 0 whatever a server before left."""
    backlog = tmp_path / "edge_backlog"
    backlog.write_bytes(struct.pack("<Q", 0) * 16 + struct.pack("<Q", 99) + bytes(4096 - 17 * 8))  # slot 2: 99
    backlog.chmod(0o600)
    (port,) = free_ports(1)
    calls = b"".join(frame(HEADERS, END_HEADERS | END_STREAM, n, b"\x82") for n in (1, 3, 5))
    resets = frame(RST_STREAM, 0, 1, CANCEL) + frame(RST_STREAM, 0, 3, CANCEL) + frame(RST_STREAM, 0, 7, CANCEL)
    sent = PREFACE + calls + resets
    server_frames = frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x88") + frame(HEADERS, END_HEADERS, 5, b"\x88")
    env = {**os.environ, "LD_PRELOAD": str(shim), "TRITON_GUARD_H2_PORTS": str(port)}
    env["TRITON_GUARD_BACKLOG"] = f"2:{backlog}"
    process = subprocess.Popen(
        [sys.executable, "-c", STAND_IN_CLOSES, str(port), str(len(sent)), server_frames.hex()],
        env=env,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout.readline() == b"listening\n"
        assert _slot(backlog, 2) == 0
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(sent)
            assert process.stderr.readline() == b"wrote\n"
            assert client.recv(len(server_frames), socket.MSG_WAITALL) == server_frames
            assert _slot(backlog, 2) == 1  # 3 runs on for nobody; 1 ended; 5 was not reset; 7 never opened
        assert process.stderr.readline() == b"closed\n"
        assert _slot(backlog, 2) == 0
        assert _slot(backlog, 0) == 0 and _slot(backlog, 3) == 0
    finally:
        _finish(process, b"\n")


def test_a_backlog_file_open_to_others_is_not_used(shim, tmp_path):
    """The slot is written only in a private file of the server's user: a file others can write is refused,
    saying so, and the guard works on without it."""
    backlog = tmp_path / "edge_backlog"
    backlog.write_bytes(bytes(4096))
    backlog.chmod(0o666)
    (port,) = free_ports(1)
    env = {**os.environ, "LD_PRELOAD": str(shim), "TRITON_GUARD_H2_PORTS": str(port)}
    env["TRITON_GUARD_BACKLOG"] = f"0:{backlog}"
    process = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout.readline() == b"listening\n"
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(PREFACE + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x82") + frame(RST_STREAM, 0, 1, CANCEL))
    out, err = _finish(process)
    assert out.endswith(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1)))
    assert b"cannot use the backlog file" in err
    assert _slot(backlog, 0) == 0


def test_the_shim_exports_only_the_libc_calls_it_wraps(shim):
    """Preloaded into tritonserver, any other name it exported would stand in for a same-named one of tritonserver's
    libraries: what its files share stays hidden (server/triton/front/*.h)."""
    import shutil

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) here to read the library's dynamic symbols")
    listed = subprocess.run([nm, "-D", "--defined-only", str(shim)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in listed.stdout.splitlines() if line.split()[1:2] != ["A"]}
    wrapped = {"accept", "accept4", "close", "execvp", "fchmod", "ioctl", "mkdtemp", "read", "readv", "recv"}
    wrapped |= {"recvmsg", "send", "sendmsg", "shm_open", "system", "write", "writev"}
    assert exported == wrapped, exported ^ wrapped
