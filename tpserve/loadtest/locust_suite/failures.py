"""How a failed request reaches Locust's failure table."""

from __future__ import annotations


class RequestFailed(Exception):
    """A failed request as Locust's failure table groups it: the status and Triton's message. tritonclient's
    gRPC exceptions are made with keyword arguments, so their repr, which Locust groups by, is empty."""

    @classmethod
    def of(cls, error: BaseException) -> RequestFailed:
        status_of, message_of = getattr(error, "status", None), getattr(error, "message", None)
        status = status_of() if callable(status_of) else None
        message = message_of() if callable(message_of) else str(error)
        text = f"{status}: {message}" if status else f"{type(error).__name__}: {message}"
        return cls(" ".join(str(text).split())[:300])
