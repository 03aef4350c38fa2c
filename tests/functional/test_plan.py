"""`plan` end to end on digits_cnn with a synthetic recording: real deployments started as serve and cluster start
them, the recording replayed open loop at GROWTH x; a generous SLO is met by one replica and proven by the closing
replay, an impossible one ends at the first probe of each size and says nothing on this host meets it."""

import json

import pytest

from tpserve.builders.build import build_model
from tpserve.builders.request import BuildRequest
from tpserve.common.traffic import RecordedInput, RecordedRequest, RecordingWriter
from tpserve.loadtest.planning import report
from tpserve.loadtest.planning.plan import PlanRequest, make_plan

pytestmark = pytest.mark.functional


@pytest.fixture(scope="module")
def planned(digits_build, tmp_path_factory):
    spec, built, _ = digits_build
    folder = tmp_path_factory.mktemp("plan")
    build_model(BuildRequest(spec=spec, target="embedded", repo=folder / "repo", work_dir=folder / "work"), built)
    with RecordingWriter(folder / "recording") as writer:
        for i in range(90):
            batch = 1 + i % 3
            writer.write(
                RecordedRequest(
                    arrival_us=1_000_000 + i * 33_000,
                    model="digits_cnn",
                    protocol="grpc" if i % 2 else "http",
                    inputs=(RecordedInput("input", "FP32", (batch, 1, 8, 8)),),
                    batch=batch,
                )
            )
        writer.write(RecordedRequest(arrival_us=1_500_000, model="digits_cnn", protocol="http", inputs=(), status=400))
    return folder


def _request(folder, slo_ms: float, name: str) -> PlanRequest:
    return PlanRequest(
        recording=folder / "recording",
        repo=folder / "repo",
        slo_p99_ms=slo_ms,
        growth=2,
        out=folder / name,
        max_replicas=1,
        instances=(1,),
        delays_us=(0,),
    )


def test_a_generous_slo_is_met_by_one_replica_and_the_closing_replay_proves_it(planned):
    plan = make_plan(_request(planned, 5000, "met"))
    assert plan.traffic.requests == 90 and plan.traffic.left_out == {"not answered when recorded (status 400)": 1}
    assert plan.found.chosen is not None and plan.found.chosen.deployment.replicas == 1
    assert plan.closing is not None and plan.closing.verdict == "meets" and plan.closing.sent == 90
    assert plan.closing.offered_per_s == pytest.approx(2 * 89 / 2.937, rel=0.05)
    assert plan.closing.phases_us["requests"] >= 90 and plan.closing.phases_us["compute_us"] > 0
    assert plan.headroom is not None and plan.headroom.speed == 3
    text = report.write(plan, "test").read_text()
    assert "make serve REPO=" in text and "the plan holds" in text
    data = json.loads((planned / "met" / "plan.json").read_text())
    assert data["closing"]["verdict"] == "meets" and data["trials"][0]["probe"] is True
    assert (planned / "met" / "plan.png").exists() and (planned / "met" / "plan.html").exists()


def test_an_impossible_slo_ends_at_the_probe_and_says_so(planned):
    plan = make_plan(_request(planned, 0.001, "missed"))
    assert plan.found.chosen is None and plan.closing is None
    assert [t.verdict for t in plan.found.trials] == ["clear miss"], "a clear miss skips the whole replay"
    assert "Nothing this host can run meets" in report.write(plan, "test").read_text()
