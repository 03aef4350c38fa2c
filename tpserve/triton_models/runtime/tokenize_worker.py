"""The tokenize step's work in a process of its own, beside an in-process engine.

In tritonserver every model of the in-process backend shares one interpreter, and its GIL: served from text,
the engine's thread waited 15 of every 18.5 ms of its batch steps while the tokenize step ran Python
(docs/benchmarks.md, run F). Here the tokenize step's instance hands each batch's raw TEXT buffers to a child
Python over a pipe and gets each request's (ids, mask) back; parsing, decoding and tokenizing run in the
child, outside the server's GIL. Writing and reading the pipe release the GIL.

Frames both ways: an 8-byte little-endian length, then a pickle. Parent to child: a list of (raw BYTES
buffer, element count) per request. Child to parent: per request, (ids, mask) or the ValueError that refuses it.
The pipe is the two processes' own (no path, no port); the child ends when its stdin closes.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

HEADER = struct.Struct("<Q")


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int):
    """The next frame's object, or None at the end of the stream."""
    head = _read_exactly(fd, HEADER.size)
    if head is None:
        return None
    body = _read_exactly(fd, HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def write_frame(fd: int, value) -> None:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def tokenize_raw(tokenizer, requests: list[tuple[bytes, int]]) -> list:
    """Per request, (ids, mask) or the ValueError that refuses it alone (a malformed buffer included)."""
    from tpserve.triton_models.runtime.tokenize_core import parse_bytes, tokenize

    results: list = [None] * len(requests)
    texts, good = [], []
    for index, (raw, count) in enumerate(requests):
        try:
            texts.append(parse_bytes(raw, count))
            good.append(index)
        except ValueError as err:
            results[index] = err
    for index, result in zip(good, tokenize(tokenizer, texts)):
        results[index] = result
    return results


class TokenizeWorker:
    """The parent's end: one child per tokenize instance (an instance runs one batch at a time)."""

    def __init__(self, tokenizer_path: str, max_length: int):
        self.args = [
            sys.executable,
            "-m",
            "tpserve.triton_models.runtime.tokenize_worker",
            tokenizer_path,
            str(max_length),
        ]
        self.lock = threading.Lock()
        self.child: subprocess.Popen | None = None
        self.pipes = (-1, -1)  # the child's stdin and stdout descriptors (-1: none)
        self._start()

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[3])  # where tpserve is imported from
        paths = [root, *[p for p in sys.path if p and p != root]]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        self.child = child = subprocess.Popen(
            self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True, bufsize=0
        )
        assert child.stdin is not None and child.stdout is not None  # pipes
        self.pipes = (child.stdin.fileno(), child.stdout.fileno())
        if read_frame(self.pipes[1]) != "ready":
            self.close()
            raise RuntimeError(f"the tokenize worker did not start ({' '.join(self.args)})")

    def tokenize(self, requests: list[tuple[bytes, int]]) -> list:
        """Per request, (ids, mask) or a ValueError. A child that died is started again once, for this batch."""
        with self.lock:
            for attempt in (0, 1):
                try:
                    write_frame(self.pipes[0], requests)
                    found = read_frame(self.pipes[1])
                    if found is not None:
                        return found
                except OSError:  # a broken pipe: the child died
                    pass
                if attempt == 0:
                    self.close()
                    self._start()
            raise RuntimeError("the tokenize worker ended while tokenizing")

    def close(self) -> None:
        child, self.child, self.pipes = self.child, None, (-1, -1)
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


class TokenizePool:
    """Several children behind one tokenize instance: a batch's requests are split into contiguous groups of
    about as many texts each, one group a child, tokenized at once (each call waits on its pipe without the GIL).

    One instance with its children batches as the load asks for: while it works, requests queue in Triton's
    batcher and come as the next batch, so no queue delay is needed for batches to grow; several instances
    without a delay each take the few requests queued, and pay the pipe per request.
    """

    def __init__(self, tokenizer_path: str, max_length: int, processes: int):
        from concurrent.futures import ThreadPoolExecutor

        self.threads = ThreadPoolExecutor(max_workers=processes, thread_name_prefix="tokenize")
        self.workers: list[TokenizeWorker] = []
        try:
            for _ in range(processes):
                self.workers.append(TokenizeWorker(tokenizer_path, max_length))
        except Exception:
            self.close()
            raise

    def tokenize(self, requests: list[tuple[bytes, int]]) -> list:
        """Per request, (ids, mask) or a ValueError, in the order given."""
        groups = split(requests, len(self.workers))
        if len(groups) == 1:
            return self.workers[0].tokenize(requests)
        futures = [self.threads.submit(w.tokenize, g) for w, g in zip(self.workers, groups)]
        return [result for future in futures for result in future.result()]

    def close(self) -> None:
        self.threads.shutdown(wait=True)
        for worker in self.workers:
            worker.close()


def split(requests: list[tuple[bytes, int]], parts: int) -> list[list]:
    """Contiguous groups of requests, at most `parts`, each of about the same number of texts."""
    total = sum(count for _, count in requests)
    parts = max(1, min(parts, len(requests)))
    groups: list[list] = [[]]
    done, share = 0, total / parts
    for request in requests:
        if groups[-1] and done >= share * len(groups) and len(groups) < parts:
            groups.append([])
        groups[-1].append(request)
        done += request[1]
    return groups


def main(argv: list[str]) -> int:
    from tpserve.triton_models.runtime.tokenize_core import load_tokenizer

    os.umask(0o077)
    tokenizer = load_tokenizer(argv[0], int(argv[1]))
    inbox, outbox = sys.stdin.buffer.fileno(), os.dup(sys.stdout.buffer.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print goes to stderr, never into a frame
    write_frame(outbox, "ready")
    while (requests := read_frame(inbox)) is not None:
        write_frame(outbox, tokenize_raw(tokenizer, requests))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
