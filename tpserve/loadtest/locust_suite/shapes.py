"""Load shapes for Locust's LoadTestShape: a step load (users added in steps) and bursts (all users on, then one)."""

from __future__ import annotations

import os

from locust import LoadTestShape

from tpserve.loadtest.locust_suite.burst import burst_users


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


class BurstLoad(LoadTestShape):
    """Bursts: STEP_MAX_USERS users for BURST_ON_SECONDS, then one user for BURST_OFF_SECONDS, again and again,
    until STEP_TOTAL_SECONDS. With open-loop users (a rate per user) the arrival rate jumps with them."""

    abstract = os.environ.get("LOAD_SHAPE", "") != "burst"
    max_users = int(os.environ.get("STEP_MAX_USERS", "8"))
    on_seconds = float(os.environ.get("BURST_ON_SECONDS", "10"))
    off_seconds = float(os.environ.get("BURST_OFF_SECONDS", "20"))
    total_seconds = float(os.environ.get("STEP_TOTAL_SECONDS", "60"))

    def tick(self):
        return burst_users(self.get_run_time(), self.max_users, self.on_seconds, self.off_seconds, self.total_seconds)
