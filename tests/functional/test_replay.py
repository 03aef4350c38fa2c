"""Replay end to end (`make replay`): a synthetic recording (HTTP and gRPC, two shapes, one refused request)
replayed open loop through Locust, and through the fast generator's two processes, against a server that records
what it sees; the server's recording of the replay has the same requests, protocols and shape histogram, and the
report is written."""

import pytest

from tests.functional.conftest import behind_edge
from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.common import endpoints
from tpserve.common.errors import RecordingError
from tpserve.common.traffic import RecordedInput, RecordedRequest, RecordingWriter, read_recording
from tpserve.loadtest.locust_suite.replay import Replay, run_replay
from tpserve.loadtest.reporting.replay_report import compare_recordings, summarize, write_report
from tpserve.server.edge.recording import record_settings
from tpserve.server.single import start_single
from tpserve.server.stack import stop_stack

pytestmark = pytest.mark.functional


def _synthetic(folder) -> list[RecordedRequest]:
    written = []
    with RecordingWriter(folder) as writer:
        for i in range(40):
            batch = 1 + i % 3
            inputs = (RecordedInput("input", "FP32", (batch, 1, 8, 8)),)
            protocol = "grpc" if i % 2 else "http"
            written.append(
                RecordedRequest(
                    arrival_us=1_000_000 + i * 50_000, model="digits_cnn", protocol=protocol, inputs=inputs, batch=batch
                )
            )
        written.append(
            RecordedRequest(arrival_us=1_500_000, model="digits_cnn", protocol="http", inputs=(), status=400)
        )
        for request in written:
            writer.write(request)
    return written


@pytest.mark.parametrize("generator", ["locust", "fast"])
def test_a_replay_reaches_the_server_as_recorded(generator, digits_build, tmp_path):
    spec, built, _ = digits_build
    build_model(BuildRequest(spec=spec, target="embedded", repo=tmp_path / "repo", work_dir=tmp_path / "work"), built)
    original = _synthetic(tmp_path / "recording")
    settings = behind_edge(tmp_path / "repo", tmp_path / "state", record=record_settings("1", tmp_path / "state"))
    start_single(settings)
    try:
        state = endpoints.read_state(settings.state_dir)
        result = run_replay(
            Replay(recording=tmp_path / "recording", generator=generator, processes=2),
            state.http_url,
            state.grpc_url,
            None,
            tmp_path / "out",
        )
    finally:
        stop_stack(settings.state_dir)
    summary = summarize(result, 1.0)
    assert summary["replayed_total"] == 40 and summary["left_out"] == {
        "no inputs read (status 400: refused before the server)": 1
    }
    assert {s["status"] for s in summary["statuses"]} == {"ok"}
    as_seen = list(read_recording(settings.record.folder, replayed=True))
    assert as_seen and all(r.replayed for r in as_seen), "the server's recording marks a replay's requests"
    with pytest.raises(RecordingError, match="sent by a replay"):  # not its traffic: fit and tune leave them out
        list(read_recording(settings.record.folder))
    seen = compare_recordings(original, as_seen)
    assert seen["replayed_total"] == 40 and seen["shapes_identical"]
    assert seen["replayed_protocols"] == {"http": 20, "grpc": 20}
    assert write_report(summary, tmp_path / "out", "test").exists() and (tmp_path / "out" / "replay.png").exists()
