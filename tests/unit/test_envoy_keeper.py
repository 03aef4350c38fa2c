"""Envoy's keeper (server/edge/envoy_process.py) is stopped alone and gives Envoy one SIGTERM: a second one, landing
after Envoy dropped its handler, kills it before it writes the access log lines it holds (a recording's last)."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tpserve.server.triton.processes import alive, terminate_group

# Stands in for Envoy: counts each SIGTERM in a file and takes 0.5 s to shut down after the first.
FAKE_ENVOY = """\
import signal, sys, time
count = sys.argv[0] + ".terms"
stopping = []
def on_term(*_):
    with open(count, "a") as handle:
        handle.write("TERM\\n")
    stopping.append(time.monotonic())
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[0] + ".up", "w").close()
while not stopping or time.monotonic() - stopping[0] < 0.5:
    time.sleep(0.01)
"""


def _keeper(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    fake = tmp_path / "envoy"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_ENVOY)
    fake.chmod(0o700)
    log = tmp_path / "envoy.log"
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from tpserve.server.edge.envoy_process import run
        run(Path({str(fake)!r}), Path("unused.json"), Path({str(log)!r}))
        """
    )
    root = Path(__file__).resolve().parents[2]
    keeper = subprocess.Popen([sys.executable, "-c", code], cwd=root, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "envoy.up").exists():
        assert time.monotonic() < deadline and keeper.poll() is None, "the keeper did not start its Envoy"
        time.sleep(0.05)
    return keeper, log


def test_stopping_the_keeper_gives_envoy_one_sigterm_and_it_exits_cleanly(tmp_path):
    keeper, log = _keeper(tmp_path)
    assert terminate_group(keeper.pid, leader_only=True)
    assert not alive(keeper.pid)
    assert (tmp_path / "envoy.terms").read_text().splitlines() == ["TERM"]
    assert "envoy stopped with code 0" in log.read_text()
