"""The models' side of the edge's cancelled-calls table (triton_models/python_backend/cancelled_calls.py): a
request whose call
id is in the table is answered CANCELLED without running; the others run as before, answered in order."""

import json

import numpy as np
import pytest

from tpserve.server.edge.cancel_table import make_table
from tpserve.triton_models.python_backend.cancelled_calls import SLOTS, CancelledCalls, call_ids, serve_live


class Sender:
    def __init__(self, log, index):
        self.log, self.index = log, index

    def send(self, response, flags):
        self.log.append((self.index, response))


class Request:
    def __init__(self, index, parameters, log):
        self.index, self.text, self.log = index, json.dumps(parameters), log

    def parameters(self):
        return self.text

    def get_response_sender(self):
        return Sender(self.log, self.index)


class PbUtils:
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class TritonError:
        CANCELLED, UNAVAILABLE = 11, 14

        def __init__(self, message, code):
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.error = error


def _table(tmp_path, ids):
    path = make_table(tmp_path)
    slots = np.memmap(path, np.uint64, "r+", shape=(SLOTS,))
    for i in ids:
        slots[i % SLOTS] = i
    slots.flush()
    return CancelledCalls(str(path))


def test_the_call_id_is_read_whatever_the_header_case_and_nothing_else_counts():
    assert call_ids(Request(0, {"x-edge-call": "00000000000000ff"}, [])) == (255,)
    assert call_ids(Request(0, {"X-Edge-Call": "00000000000000ff"}, [])) == (255,)
    for value in ({}, {"x-edge-call": "ff"}, {"x-edge-call": "zzzzzzzzzzzzzzzz"}, {"x-edge-call": 5}):
        assert call_ids(Request(0, value, [])) == ()


class Raw(Request):
    def __init__(self, index, text, log):
        self.index, self.text, self.log = index, text, log


def test_a_clients_own_parameter_of_the_name_cannot_hide_the_calls_id(tmp_path):
    """gRPC's request parameters reach the model beside the forwarded header, in either order: every id counts,
    so the call the client cancelled is still answered unrun."""
    log, ran = [], []
    table = _table(tmp_path, [0xAB])
    texts = ['{"x-edge-call":"00000000000000ab","x-edge-call":"0000000000000011"}',
             '{"X-Edge-Call":"0000000000000011","x-edge-call":"00000000000000ab"}',
             '{"x-edge-call":"0000000000000011","priority":0}']  # fmt: skip
    requests = [Raw(i, text, log) for i, text in enumerate(texts)]
    assert call_ids(requests[0]) == (0xAB, 0x11)

    def execute(live):
        ran.extend(r.index for r in live)
        return [f"answer {r.index}" for r in live]

    serve_live(requests, table, execute, PbUtils)
    assert ran == [2]
    assert all(dict(log)[i].error.code == PbUtils.TritonError.CANCELLED for i in (0, 1))


def test_cancelled_requests_are_answered_unrun_and_the_rest_run_in_order(tmp_path):
    log, ran = [], []
    table = _table(tmp_path, [0xAB, 0xCD])
    requests = [Request(i, {"x-edge-call": f"{c:016x}"}, log) for i, c in enumerate([0xAB, 0x11, 0xCD, 0x22])]

    def execute(live):
        ran.extend(r.index for r in live)
        return [f"answer {r.index}" for r in live]

    assert serve_live(requests, table, execute, PbUtils) is None  # every answer went through its sender
    assert ran == [1, 3]
    answers = dict(log)
    assert answers[1] == "answer 1" and answers[3] == "answer 3"
    assert answers[0].error.code == PbUtils.TritonError.CANCELLED and "cancelled" in answers[0].error.message
    assert answers[2].error.code == PbUtils.TritonError.CANCELLED


def test_nothing_cancelled_or_no_table_runs_the_batch_as_it_was(tmp_path):
    log = []
    requests = [Request(i, {"x-edge-call": f"{i + 1:016x}"}, log) for i in range(3)]
    execute = lambda live: [r.index for r in live]  # noqa: E731
    assert serve_live(requests, _table(tmp_path, [0x99]), execute, PbUtils) == [0, 1, 2]
    assert serve_live(requests, None, execute, PbUtils) == [0, 1, 2]
    assert log == []


def test_the_table_is_private_and_fresh_at_each_start(tmp_path):
    path = make_table(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_size == SLOTS * 8
    np.memmap(path, np.uint64, "r+", shape=(SLOTS,))[7] = 7
    assert not np.memmap(make_table(tmp_path), np.uint64, "r", shape=(SLOTS,)).any()


def test_the_backlog_file_is_private_and_each_server_is_told_its_slot(tmp_path):
    """make_table makes the backlog file beside the table (0600, 64 slots of 64 bytes, zeros); a server's
    environment names its slot; the edge's bound grows with the servers behind it; a 65th server is refused."""
    import stat

    from tpserve.common.errors import ServerError
    from tpserve.server.edge import cancel_table

    table = make_table(tmp_path)
    backlog = cancel_table.backlog_of(table)
    assert stat.S_IMODE(backlog.stat().st_mode) == 0o600 and backlog.stat().st_size == 4096
    assert cancel_table.read_backlog(table) == [0] * 64
    env = cancel_table.server_environment(table, 3)
    assert env[cancel_table.GUARD_VARIABLE] == f"3:{backlog}" and env["TRITON_CANCELLED_CALLS"] == str(table)
    text = cancel_table.module_config(table, 2)
    assert f"backlog {str(backlog).encode().hex()}" in text and "limit 128" in text.split("\n")
    with pytest.raises(ServerError, match="at most 64 replicas"):
        cancel_table.server_environment(table, 64)
