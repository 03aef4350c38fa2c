"""The burst load's schedule, apart from Locust (importing locust patches the process for gevent)."""


def burst_users(elapsed: float, max_users: int, on_seconds: float, off_seconds: float, total_seconds: float):
    """(users, spawn rate) at elapsed seconds: max_users during each burst, one between bursts; None past the end."""
    if elapsed > total_seconds:
        return None
    burst = elapsed % (on_seconds + off_seconds) < on_seconds
    users = max_users if burst else 1
    return users, max(1, users * 10)
