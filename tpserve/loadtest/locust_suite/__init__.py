"""Locust: the run, the Triton user, load shapes, SLO thresholds, locustfiles."""

GENERATORS = ("locust", "fast")  # a replay's load generators: Locust's replay, or workloads/open_loop.py
