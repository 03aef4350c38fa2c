"""The supervisor's HTTP endpoint for load balancers, hardened against slow and many clients.

http.server's ThreadingHTTPServer starts a thread per connection without limit and waits forever for
a request line, so 200 half-sent requests held 200 threads. Here at most MAX_CONNECTIONS are served at
once (one more is closed at once) and a connection that does not send its request within
REQUEST_TIMEOUT_S is dropped.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

MAX_CONNECTIONS = 32
REQUEST_TIMEOUT_S = 5.0


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a connection limit and a socket timeout per connection."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections: int = MAX_CONNECTIONS, timeout_s: float = REQUEST_TIMEOUT_S):
        handler.timeout = timeout_s  # StreamRequestHandler applies it to the connection's socket
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: refuse at once rather than queue a thread
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
