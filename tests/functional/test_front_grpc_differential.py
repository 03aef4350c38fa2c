"""What the front hands gRPC, held to what tritonserver 2.51's own gRPC accepts. Generated frame sequences (calls
whose header blocks and messages are split, padded, prioritised and flagged every way, control frames of every type
and flag, size updates anywhere, a byte flipped now and then) go through the guard loaded into a stand-in program
that prints what it read; that is then sent to a plain tritonserver (no front) on a connection of its own, which
must never end it: gRPC ending a connection cancels every call it runs, tritonserver 2.51's crash. A fresh seed every
run, printed."""

import os
import random
import select
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.functional import hostile_grpc as hostile
from tests.functional.conftest import start_digits, stop_digits
from tpserve.common import endpoints
from tpserve.common.endpoints import free_ports

pytestmark = pytest.mark.functional
CASES = int(os.environ.get("FRONT_DIFFERENTIAL_CASES", "80"))
F = hostile.frame

# accepts connections on argv[1] one at a time, reads each (waiting on EAGAIN) until it is quiet for 0.2 s, prints
# what it read as one hex line, then waits for the client to close before taking the next
STAND_IN = """
import select, socket, sys, time
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen(8); print("listening", flush=True)
while True:
    conn, _ = server.accept(); conn.setblocking(False)
    read, last = b"", time.monotonic()
    while time.monotonic() - last < 0.2:
        select.select([conn], [], [], 0.05)
        try:
            chunk = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            break
        if not chunk:
            break
        read, last = read + chunk, time.monotonic()
    print(read.hex(), flush=True)
    select.select([sys.stdin], [], [], 5)
    sys.stdin.readline()
    conn.close()
"""


@pytest.fixture(scope="module")
def plain(digits_build, tmp_path_factory):
    """tritonserver alone (`--front none`): the reference for what its gRPC accepts."""
    state_dir = start_digits(digits_build, tmp_path_factory.mktemp("plain"), "--front", "none", "--no-supervise")
    yield endpoints.read_state(state_dir)
    stop_digits(state_dir)


@pytest.fixture(scope="module")
def guard(shim):
    """The guard on a public gRPC port, as `server start` serves it, in a stand-in that prints what it read."""
    (port,) = free_ports(1)
    env = {
        **os.environ,
        "LD_PRELOAD": str(shim),
        "TRITON_GUARD_H2_PORTS": str(port),
        "TRITON_GUARD_H2_PUBLIC": str(port),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(port)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert process.stdout.readline() == b"listening\n"
    yield port, process
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def shim():
    from tpserve.server.triton.preloads import build_library

    return build_library()


def through_guard(guard, sent: bytes) -> bytes:
    port, process = guard
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(sent)
        ready, _, _ = select.select([process.stdout], [], [], 20)
        assert ready, "the stand-in printed nothing"
        line = process.stdout.readline()
    process.stdin.write(b"\n")
    process.stdin.flush()
    return bytes.fromhex(line.decode().strip())


class Sequence:
    """One connection's frames, generated from a random source."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.caller = hostile.Caller("digits_cnn", "input", np.zeros((1, 1, 8, 8), np.float32))
        self.opened: list[int] = []

    def flags(self, defined: int) -> int:
        return defined | (self.rng.randrange(256) if self.rng.random() < 0.2 else 0)

    def block(self) -> bytes:
        block = self.caller.block()
        roll = self.rng.random()
        if roll < 0.1:
            block = b"\x20" * self.rng.randrange(1, 4) + block  # size updates first: gRPC takes two
        elif roll < 0.15:
            at = self.rng.randrange(1, len(block))
            block = block[:at] + b"\x3f\xe1\x1f" + block[at:]  # one anywhere (maybe inside a field)
        return block

    def call(self) -> bytes:
        stream, self.caller.next_stream = self.caller.next_stream, self.caller.next_stream + 2
        self.opened.append(stream)
        block, out = self.block(), b""
        cuts = sorted(self.rng.sample(range(1, len(block)), k=min(len(block) - 1, self.rng.randrange(3))))
        parts = [block[a:b] for a, b in zip([0, *cuts], [*cuts, len(block)])]
        head, flags = parts[0], 0
        if self.rng.random() < 0.2:
            head, flags = bytes([0, 0, 0, 0, 15]) + head, 0x20  # a priority
        if self.rng.random() < 0.05:
            head, flags = b"\x01" + head + b"\0", flags | 0x8  # padded
        for i, part in enumerate(parts):
            last = 0x4 if i == len(parts) - 1 else 0
            out += (
                F(hostile.HEADERS, self.flags(flags | last), stream, head)
                if i == 0
                else F(9, self.flags(last), stream, part)
            )
        message = self.caller.message
        if self.rng.random() < 0.8:
            split = self.rng.randrange(1, len(message)) if self.rng.random() < 0.3 else len(message)
            for i, piece in enumerate([message[:split], message[split:]]):
                if not piece:
                    continue
                end = 0x1 if i == 1 or split == len(message) else 0
                if self.rng.random() < 0.15:
                    out += F(hostile.DATA, self.flags(end | 0x8), stream, b"\x02" + piece + b"\0\0")
                else:
                    out += F(hostile.DATA, self.flags(end), stream, piece)
        return out

    def control(self) -> bytes:
        rng, stream = self.rng, self.rng.choice(self.opened or [1])
        kind = rng.randrange(7)
        if kind == 0:
            entries = b"".join(
                rng.choice([1, 2, 3, 4, 5, 6, 8, 0x99]).to_bytes(2, "big")
                + rng.choice([0, 1, 100, 4096, 16384, 65535, 1 << 20]).to_bytes(4, "big")
                for _ in range(rng.randrange(3))
            )
            return F(hostile.SETTINGS, self.flags(0), 0, entries)
        if kind == 1:
            return F(hostile.SETTINGS, self.flags(hostile.ACK), 0)
        if kind == 2:
            return F(hostile.PING, self.flags(0), 0, rng.randbytes(8))
        if kind == 3:
            increment = rng.choice([0, 1, 1000, 1 << 20])
            return F(hostile.WINDOW_UPDATE, self.flags(0), rng.choice([0, stream]), increment.to_bytes(4, "big"))
        if kind == 4:
            return F(2, self.flags(0), stream, rng.choice([0, 3, stream]).to_bytes(4, "big") + b"\x10")
        if kind == 5:
            return F(hostile.RST_STREAM, self.flags(0), stream, rng.choice([0, 8]).to_bytes(4, "big"))
        return F(rng.choice([0x42, 0xFA, 7]), self.flags(0), 0, rng.randbytes(8))

    def make(self) -> bytes:
        out = self.caller.opening
        for _ in range(self.rng.randrange(1, 6)):
            out += self.call() if self.rng.random() < 0.5 else self.control()
        if self.rng.random() < 0.1:  # a byte flipped after the preface
            at = self.rng.randrange(len(hostile.PREFACE), len(out))
            out = out[:at] + bytes([out[at] ^ (1 << self.rng.randrange(8))]) + out[at + 1 :]
        return out


def test_grpc_is_handed_only_what_tritonserver_s_own_grpc_accepts(plain, guard):
    seed = random.randrange(2**31)
    print(f"front differential: seed {seed} ({CASES} sequences; FRONT_DIFFERENTIAL_CASES for more)")
    rng, failures, cut = random.Random(seed), [], 0
    for case in range(CASES):
        sent = Sequence(rng).make()
        handed = through_guard(guard, sent)
        cut += handed != sent
        if hostile.connection_failed(plain.grpc_port, handed, seconds=0.3):
            failures.append((case, sent.hex(), handed.hex()))
    print(f"{CASES} sequences, {cut} changed or cut by the front, {len(failures)} that gRPC ended the connection for")
    assert not failures, f"seed {seed}: gRPC ended the connection for what the front handed it: {failures[:3]}"
