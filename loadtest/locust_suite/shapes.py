"""Load shapes: a step load (users added in steps) for Locust's LoadTestShape."""

from __future__ import annotations

import os

from locust import LoadTestShape


class StepLoad(LoadTestShape):
    """Add STEP_USERS users every STEP_SECONDS, up to STEP_MAX_USERS, then stop after STEP_TOTAL_SECONDS."""

    abstract = os.environ.get("LOAD_SHAPE", "") != "step"
    step_users = int(os.environ.get("STEP_USERS", "2"))
    step_seconds = float(os.environ.get("STEP_SECONDS", "5"))
    max_users = int(os.environ.get("STEP_MAX_USERS", "8"))
    total_seconds = float(os.environ.get("STEP_TOTAL_SECONDS", "20"))

    def tick(self):
        elapsed = self.get_run_time()
        if elapsed > self.total_seconds:
            return None
        users = min(self.max_users, self.step_users * (int(elapsed // self.step_seconds) + 1))
        return users, users
