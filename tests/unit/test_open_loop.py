"""The fast open-loop generator (loadtest/workloads/open_loop.py): requests serialized once (made-up inputs shared,
recorded bodies sent as recorded), processes for the rate, and a replay whose every request fails still accounts
for each one, in sending order, without hanging."""

import base64
import json

from tpserve.common.endpoints import free_ports
from tpserve.common.traffic import RecordedInput
from tpserve.loadtest.workloads.open_loop import NOT_SENT, Target, payloads, processes_for, run_open_loop
from tpserve.loadtest.workloads.recorded import ReplayItem

FP32 = (RecordedInput("input", "FP32", (2, 1, 8, 8)),)
TARGET = Target(http_url="127.0.0.1:8000", grpc_url="127.0.0.1:8001", headers={"x-traffic-replay": "1"})


def _items(count: int, rate: float, protocol: str = "http", inputs=FP32) -> list[ReplayItem]:
    return [ReplayItem(i / rate, "m", "", protocol, inputs) for i in range(count)]


def test_made_up_requests_are_serialized_once_per_protocol_and_shape():
    items = _items(3, 10) + _items(2, 10, "grpc") + [ReplayItem(0.5, "m", "2", "http", FP32)]
    table, chosen = payloads(items, None, TARGET)
    assert len(table) == 3 and chosen[:3] == [chosen[0]] * 3 and chosen[3] == chosen[4] != chosen[0]
    http = table[chosen[0]]
    head, body = http.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v2/models/m/infer HTTP/1.1") and b"x-traffic-replay: 1" in head
    length = int(dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])[b"Inference-Header-Content-Length"])
    header = json.loads(body[:length])
    assert header["parameters"] == {"binary_data_output": True}, "every output asked for as binary"
    assert header["inputs"][0]["shape"] == [2, 1, 8, 8] and len(body) - length == 2 * 64 * 4
    assert table[chosen[5]].startswith(b"POST /v2/models/m/versions/2/infer ")

    from tritonclient.grpc import service_pb2

    message = service_pb2.ModelInferRequest.FromString(table[chosen[3]])
    assert message.model_name == "m" and list(message.inputs[0].shape) == [2, 1, 8, 8]


def test_a_recorded_body_is_sent_as_recorded():
    recorded = b'{"inputs":[]}' + b"\x00" * 16
    values = {"body": base64.b64encode(recorded).decode(), "header_length": 13}
    items = [ReplayItem(0.0, "m", "", "http", FP32, values), ReplayItem(0.1, "m", "", "grpc", FP32, values)]
    table, chosen = payloads(items, None, TARGET)
    head, body = table[chosen[0]].split(b"\r\n\r\n", 1)
    assert body == recorded and b"Inference-Header-Content-Length: 13" in head
    assert table[chosen[1]] == recorded, "a gRPC body is the recorded ModelInferRequest itself"


def test_made_up_bytes_cannot_be_sent_and_are_marked_so():
    texts = (RecordedInput("text", "BYTES", (1,)),)
    table, chosen = payloads(_items(2, 10, inputs=texts), None, TARGET)
    assert table == [] and chosen == [NOT_SENT, NOT_SENT]


def test_processes_follow_the_rate_within_half_the_cores():
    assert processes_for(_items(100, 50), cores=16) == 1
    assert processes_for(_items(60_000, 6000), cores=16) == 4
    assert processes_for(_items(60_000, 60_000), cores=16) == 8
    assert processes_for(_items(60_000, 6000), cores=2) == 1


def test_every_request_to_a_closed_port_is_accounted_for_in_sending_order(tmp_path):
    port, grpc_port = free_ports(2)
    target = Target(http_url=f"127.0.0.1:{port}", grpc_url=f"127.0.0.1:{grpc_port}")
    items = _items(30, 200) + _items(10, 200, "grpc")
    items.sort(key=lambda i: i.offset_s)
    found = run_open_loop(items, None, target, tmp_path, processes=2)
    sent = found["sent"]
    assert len(sent) == 40 and found["processes"] == 2
    assert all(s["status"] != "ok" for s in sent), "nothing listens there"
    assert [s["sent_s"] for s in sent] == sorted(s["sent_s"] for s in sent)
    assert {s["protocol"] for s in sent} == {"http", "grpc"}
    lines = (tmp_path / "replay_results.jsonl").read_text().splitlines()
    assert len(lines) == 41 and json.loads(lines[0])["processes"] == 2


def test_each_process_gets_only_the_payloads_it_sends():
    from tpserve.loadtest.workloads.open_loop import _own_table

    table = [b"a", b"b", b"c"]
    share = [(0.0, "http", 2, 0), (0.1, "http", NOT_SENT, 2), (0.2, "grpc", 2, 4), (0.3, "http", 0, 6)]
    renumbered, own = _own_table(share, table)
    assert own == [b"c", b"a"] and [own[p] if p != NOT_SENT else None for _, _, p, _ in renumbered] == [
        b"c",
        None,
        b"c",
        b"a",
    ]
