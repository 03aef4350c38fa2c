"""Keep Envoy running for a cluster: start it, restart it if it dies, stop it on SIGTERM.

Envoy is run as the child of this small foreground process (`python -m tpserve.server envoy-run`, which the
cluster starts in a session of its own): Envoy stops when its parent exits (measured: a SIGTERM
reaches it as soon as the process that started it exits), so the cluster's command cannot start it
and return.

Envoy gets one SIGTERM, from this keeper (stop_cluster signals the keeper alone, not its group). A second one
that lands in the few milliseconds after Envoy has dropped its handler and before it exits kills it by the
signal's default action (measured: code -15 with the second SIGTERM 5 ms after the first), and the access log
lines still in Envoy's buffer, a recording's last requests, are lost.
Envoy writes its access log every FLUSH_MS (Envoy's default is 10 s): a recording is on disk that soon, and a
crash loses no more than that.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

FLUSH_MS = 1000  # how often Envoy writes its access log (a recording) to disk


def run(binary: Path, config: Path, log: Path, keep=None) -> int:
    """Run Envoy until SIGTERM/SIGINT; restart it (after 0.5 s) whenever it exits on its own; call keep()
    about once a second meanwhile (a recording's rotation).

    Hot restart is off: Envoy then keeps no shared-memory files in /dev/shm (they outlived crashed runs)."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    command = [str(binary), "-c", str(config), "--log-level", "warn", "--disable-hot-restart", "--drain-time-s", "2"]
    command += ["--file-flush-interval-msec", str(FLUSH_MS)]
    with open(log, "a") as handle:
        while not stopping.is_set():
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, umask=0o077
            )
            ticks = 0
            while process.poll() is None and not stopping.wait(0.2):
                ticks += 1
                if keep is not None and ticks % 5 == 0:
                    _keep(keep, handle)
            if stopping.is_set():
                code = _stop(process)
                handle.write(f"envoy-run: envoy stopped with code {code}\n")
                return code
            handle.write(f"envoy-run: envoy exited with code {process.returncode}; restarting\n")
            handle.flush()
            time.sleep(0.5)
    return 0


def _keep(keep, handle) -> None:
    try:
        keep()
    except OSError as err:  # a full disk or a busy admin socket must not take Envoy down: said, tried again
        handle.write(f"envoy-run: {err}\n")
        handle.flush()


def _stop(process: subprocess.Popen, timeout: float = 10.0) -> int:
    process.terminate()
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
