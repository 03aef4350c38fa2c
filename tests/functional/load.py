"""A bounded closed-loop load for functional tests: one client per endpoint, each request logged."""

import threading
import time

from tpserve.clients.infer import infer


class ClosedLoop:
    """One thread per endpoint sending `arrays` to `model`, one request at a time; a context manager.

    log: (protocol, start, end, error or None) per request, monotonic seconds.
    """

    def __init__(self, endpoints, model: str, arrays: dict, settle: float = 0.5):
        self.endpoints, self.model, self.arrays, self.settle = endpoints, model, arrays, settle
        self.stop, self.log = threading.Event(), []
        self.threads = [threading.Thread(target=self._run, args=(ep,)) for ep in endpoints]

    def _run(self, ep):
        with ep.client() as client:
            while not self.stop.is_set():
                started, error = time.monotonic(), None
                try:
                    infer(ep, self.model, self.arrays, client=client)
                except Exception as err:
                    error = f"{ep.protocol}: {err}"
                self.log.append((ep.protocol, started, time.monotonic(), error))
                time.sleep(0.005)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        time.sleep(self.settle)
        return self

    def __exit__(self, *exc):
        time.sleep(self.settle)
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def failures(self) -> list:
        return [entry for entry in self.log if entry[3] is not None]

    def counts(self) -> dict:
        """protocol -> (requests, failed)."""
        return {
            p: (sum(e[0] == p for e in self.log), sum(e[0] == p for e in self.failures()))
            for p in {e[0] for e in self.log}
        }
