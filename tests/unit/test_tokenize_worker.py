"""The tokenize step's child process (triton_models/runtime/tokenize_worker.py): the same answers as in-process, a bad
request refused alone, a child that died started again, and the child gone at close."""

import struct

import numpy as np
import pytest

from tpserve.triton_models.runtime import tokenize_core as core
from tpserve.triton_models.runtime.tokenize_worker import TokenizeWorker

pytest.importorskip("tokenizers")


def raw(texts: list[bytes]) -> tuple[bytes, int]:
    return b"".join(struct.pack("<I", len(t)) + t for t in texts), len(texts)


@pytest.fixture(scope="module")
def tokenizer_path():
    from tpserve.builders.spec.zoo.text import model_dir

    return str(model_dir() / "tokenizer.json")


def test_the_child_answers_as_the_step_in_process(tokenizer_path):
    requests = [[b"hello there", b"general kenobi!"], [b"ok", b"   "], [b"\xff"], [b"one more [CLS] text"]]
    expected = core.tokenize(core.load_tokenizer(tokenizer_path, 64), [np.array(r, dtype=object) for r in requests])
    worker = TokenizeWorker(tokenizer_path, 64)
    try:
        found = worker.tokenize([raw(r) for r in requests] + [(b"\x05\x00\x00\x00ab", 1)])
    finally:
        worker.close()
    for got, want in zip(found, expected):
        if isinstance(want, Exception):
            assert isinstance(got, ValueError) and str(got) == str(want)
        else:
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    assert isinstance(found[-1], ValueError) and "claims 5 bytes" in str(found[-1])  # malformed: refused alone


def test_a_child_that_died_is_started_again_and_close_ends_it(tokenizer_path):
    worker = TokenizeWorker(tokenizer_path, 64)
    first = worker.child
    first.kill()
    first.wait()
    try:
        (ids, mask) = worker.tokenize([raw([b"still here"])])[0]
        assert ids.shape == mask.shape and ids[0, 0] == 101
        assert worker.child is not first
    finally:
        child = worker.child
        worker.close()
    assert child.poll() is not None and worker.child is None


def test_a_small_batch_is_tokenized_in_the_server_and_a_large_one_in_the_child(tokenizer_path):
    from pathlib import Path

    from tpserve.triton_models.inprocess.tokenize_serving import TokenizeServing

    config = {"name": "tok", "input": [{"name": "TEXT"}], "parameters": {"max_length": {"string_value": "32"}}}
    serving = TokenizeServing(config, str(Path(tokenizer_path).parent))
    sent = []
    real = serving.worker.tokenize
    serving.worker.tokenize = lambda requests: sent.append(len(requests)) or real(requests)
    try:
        small = [[raw([b"a short one"])], [raw([b"two", b"texts here"])]]  # 3 texts: in the server
        large = [[raw([b"five"] * 3)], [raw([b"more", b"texts"])]]  # 5 texts: in the child
        texts = [np.array([b"a short one"], dtype=object), np.array([b"two", b"texts here"], dtype=object)]
        expected = core.tokenize(serving.tokenizer, texts)
        for got, want in zip(serving.run(small), expected):
            assert [t.tolist() for t in got] == [a.tolist() for a in want]
        assert sent == []
        assert len(serving.run(large)) == 2 and sent == [2]
    finally:
        serving.close()


def test_split_keeps_order_and_balances_texts():
    from tpserve.triton_models.runtime.tokenize_worker import split

    requests = [(b"", n) for n in (32, 1, 1, 30, 16, 16)]
    groups = split(requests, 3)
    assert [r for g in groups for r in g] == requests
    assert [sum(n for _, n in g) for g in groups] == [32, 32, 32]
    assert split(requests[:2], 4) == [[requests[0]], [requests[1]]]
    assert split(requests, 1) == [requests]


def test_a_pool_answers_each_request_in_order_as_one_child_would(tokenizer_path):
    from tpserve.triton_models.runtime.tokenize_worker import TokenizePool

    requests = [raw([f"text number {i}".encode()] * (1 + i % 3)) for i in range(9)] + [raw([b"\xff"])]
    pool = TokenizePool(tokenizer_path, 32, 3)
    one = TokenizeWorker(tokenizer_path, 32)
    try:
        got, want = pool.tokenize(requests), one.tokenize(requests)
        assert isinstance(got[-1], ValueError) and isinstance(want[-1], ValueError)
        for g, w in zip(got[:-1], want[:-1]):
            assert [a.tolist() for a in g] == [a.tolist() for a in w]
    finally:
        pool.close()
        one.close()
    assert all(w.child is None for w in pool.workers)


def test_a_bad_process_count_is_refused_with_the_fix(tokenizer_path):
    from pathlib import Path

    from tpserve.triton_models.inprocess.tokenize_serving import TokenizeServing

    params = {"tokenize_processes": {"string_value": "many"}}
    with pytest.raises(ValueError, match="expected a whole number"):
        TokenizeServing({"input": [{"name": "TEXT"}], "parameters": params}, str(Path(tokenizer_path).parent))
