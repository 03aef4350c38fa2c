"""A workload fitted from a recording (loadtest/workloads/fitted.py): rates per bin, burstiness, protocols and
shapes kept, no values; generated back, seeded, at the fitted rates times SCALE with the same shape mix."""

import json

import numpy as np
import pytest

from tpserve.common.errors import RecordingError
from tpserve.common.traffic import RecordedInput, RecordedRequest
from tpserve.loadtest.workloads.fitted import fit, generate, read_workload, write_workload

SMALL = (RecordedInput("ids", "INT64", (1, 16)),)
LARGE = (RecordedInput("ids", "INT64", (1, 64)),)


def _recording(seed: int = 0) -> list[RecordedRequest]:
    """60 s: 20/s in the first 30 s (3 of 4 small), 5/s after; half HTTP; a refused request."""
    rng, found = np.random.default_rng(seed), []
    for rate, start in ((20.0, 0.0), (5.0, 30.0)):
        t = start
        while t < start + 30:
            shape = SMALL if rng.random() < 0.75 else LARGE
            protocol = "http" if rng.random() < 0.5 else "grpc"
            found.append(
                RecordedRequest(
                    arrival_us=int(t * 1e6), model="enc", protocol=protocol, inputs=shape, values={"body": "secret"}
                )
            )
            t += rng.exponential(1 / rate)
    return found + [RecordedRequest(arrival_us=1_000, model="enc", protocol="http", inputs=(), status=400)]


def test_the_fit_keeps_rates_burstiness_protocols_and_shapes_but_no_values(tmp_path):
    workload = fit(_recording(), bin_s=10.0, source="test")
    enc = workload["models"]["enc"]
    assert [round(r) for r in enc["rate_per_s"]] == pytest.approx([20, 20, 20, 5, 5, 5], abs=3)
    assert 0.8 < enc["gap_cv"] < 1.2  # Poisson within each bin
    assert enc["protocols"]["http"] == pytest.approx(0.5, abs=0.08)
    assert [s["inputs"][0][2] for s in enc["shapes"]] == [[1, 16], [1, 64]]
    path = write_workload(workload, tmp_path / "w.json")
    assert "secret" not in path.read_text() and read_workload(path) == json.loads(path.read_text())


def test_generated_requests_follow_the_fit_scaled_and_seeded():
    workload = fit(_recording(), bin_s=10.0)
    once, again = generate(workload, scale=3.0, seed=1), generate(workload, scale=3.0, seed=1)
    assert once == again and once != generate(workload, scale=3.0, seed=2)
    early = sum(i.offset_s < 30 for i in once) / 30
    late = sum(i.offset_s >= 30 for i in once) / 30
    assert early == pytest.approx(60, rel=0.15) and late == pytest.approx(15, rel=0.25)
    small = sum(i.inputs == SMALL for i in once) / len(once)
    assert small == pytest.approx(0.75, abs=0.06)
    assert {i.protocol for i in generate(workload, protocol="grpc")} == {"grpc"}


def test_bad_workloads_and_scales_are_said(tmp_path):
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(RecordingError, match="not a workload file"):
        read_workload(tmp_path / "bad.json")
    with pytest.raises(RecordingError, match="positive factor"):
        generate(fit(_recording()), scale=0)
    with pytest.raises(RecordingError, match="nothing to fit"):
        fit([RecordedRequest(arrival_us=0, model="m", protocol="http", inputs=(), status=400)])
