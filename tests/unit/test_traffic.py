"""The traffic recording's format (common/traffic.py): lines that read back as written, rotation under a size
cap, private files, and a bad line named by file and number."""

import json
import stat

import pytest

from tpserve.common.errors import RecordingError
from tpserve.common.traffic import (
    RecordedInput,
    RecordedRequest,
    RecordingWriter,
    read_recording,
    recording_files,
    shape_histogram,
)


def _request(t: int, model: str = "minilm", length: int = 40, **kw) -> RecordedRequest:
    inputs = (RecordedInput("input_ids", "INT64", (1, length)), RecordedInput("attention_mask", "INT64", (1, length)))
    return RecordedRequest(arrival_us=t, model=model, protocol=kw.pop("protocol", "grpc"), inputs=inputs, **kw)


def test_requests_read_back_as_written_and_values_only_where_kept(tmp_path):
    written = [
        _request(0, version="1", bytes=640, duration_us=900),
        _request(1500, protocol="http", length=12, status=400),
        _request(2000, model="resnet50", values={"x": [1, 2]}),
    ]
    with RecordingWriter(tmp_path / "traffic") as writer:
        for request in written:
            writer.write(request)
    read = list(read_recording(tmp_path / "traffic"))
    assert read == written and read[2].values == {"x": [1, 2]} and read[0].values is None
    assert "values" not in (tmp_path / "traffic" / "traffic-000001.jsonl").read_text().splitlines()[0]


def test_files_rotate_under_the_cap_oldest_first_and_stay_private(tmp_path):
    folder = tmp_path / "traffic"
    with RecordingWriter(folder, max_file_bytes=1024, max_files=3) as writer:
        for t in range(200):
            writer.write(_request(t))
    files = recording_files(folder)
    assert len(files) == 3 and all(f.stat().st_size <= 1024 for f in files)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    kept = [r.arrival_us for r in read_recording(folder)]
    assert kept == sorted(kept) and kept[-1] == 199 and kept[0] > 0  # the oldest went first
    with RecordingWriter(folder, max_file_bytes=1024, max_files=3) as writer:  # a restart appends after the last
        writer.write(_request(500))
    assert [r.arrival_us for r in read_recording(folder)][-1] == 500


def test_the_shape_histogram_counts_each_models_signatures(tmp_path):
    requests = [_request(0), _request(1), _request(2, length=12), _request(3, model="resnet50")]
    histogram = shape_histogram(requests)
    assert sorted(histogram) == ["minilm", "resnet50"]
    assert histogram["minilm"][requests[0].signature()] == 2 and sum(histogram["minilm"].values()) == 3


@pytest.mark.parametrize(
    "line, words",
    [
        ('{"t": 1, "model": "m", "protocol": "smtp", "inputs": []}', "protocol"),
        ('{"t": -1, "model": "m", "protocol": "grpc", "inputs": []}', "non-negative"),
        ('{"model": "m", "protocol": "grpc", "inputs": []}', "not a recorded request"),
        ("not json", "not a recorded request"),
    ],
)
def test_a_bad_line_is_named_by_file_and_number(tmp_path, line, words):
    folder = tmp_path / "traffic"
    with RecordingWriter(folder) as writer:
        writer.write(_request(0))
    with open(recording_files(folder)[0], "a") as handle:
        handle.write(line + "\n")
    with pytest.raises(RecordingError, match=f"traffic-000001.jsonl:2: .*{words}"):
        list(read_recording(folder))


def test_no_recording_and_a_bad_cap_say_what_to_do(tmp_path):
    with pytest.raises(RecordingError, match="no recording in"):
        list(read_recording(tmp_path))
    with pytest.raises(RecordingError, match="KiB"):
        RecordingWriter(tmp_path / "t", max_file_bytes=10)


def test_a_replays_requests_are_marked_and_left_out_unless_asked_for(tmp_path):
    own = RecordedRequest(arrival_us=1, model="m", protocol="http", inputs=(RecordedInput("x", "FP32", (1, 4)),))
    sent_by_replay = RecordedRequest(
        arrival_us=2, model="m", protocol="grpc", inputs=(RecordedInput("x", "FP32", (1, 8)),), status=0, replayed=True
    )
    assert RecordedRequest.from_line(sent_by_replay.to_line()).replayed
    assert "replayed" not in own.to_line(), "a line of the traffic itself is as before"
    with RecordingWriter(tmp_path / "both") as writer:
        writer.write(own)
        writer.write(sent_by_replay)
    assert [r.arrival_us for r in read_recording(tmp_path / "both")] == [1]
    assert [r.arrival_us for r in read_recording(tmp_path / "both", replayed=True)] == [1, 2]
    with RecordingWriter(tmp_path / "replay") as writer:
        writer.write(sent_by_replay)
    with pytest.raises(RecordingError, match=r"every request .* \(1\) was sent by a replay"):
        list(read_recording(tmp_path / "replay"))
    not_true = json.loads(sent_by_replay.to_line()) | {"replayed": "yes"}
    assert not RecordedRequest.from_line(json.dumps(not_true)).replayed, "only true marks a replay"
