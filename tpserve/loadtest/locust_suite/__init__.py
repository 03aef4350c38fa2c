"""Locust: the run, the Triton user, load shapes, SLO thresholds, locustfiles."""
