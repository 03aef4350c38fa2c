"""A perf point that fails says why on its first line (what the console shows): the server's error as
perf_analyzer printed it, never "failed (exit 99):" with nothing after the colon."""

from types import SimpleNamespace

from tpserve.loadtest.perf.sweep import _failure


def test_the_reason_is_on_the_first_line():
    done = SimpleNamespace(
        returncode=99,
        stdout="*** Measurement Settings ***\n  Batch size: 1\n",
        stderr="Thread [0] had error: [request id: <id_unknown>] Gather: indices element out of data bounds, "
        "idx=30120 must be within the inclusive range [-1000,999]\n",
    )
    first = _failure(done).splitlines()[0]
    assert first.startswith("perf_analyzer failed (exit 99): Thread [0] had error") and "30120" in first
    silent = _failure(SimpleNamespace(returncode=99, stdout="", stderr=""))
    assert "printed nothing" in silent.splitlines()[0]
