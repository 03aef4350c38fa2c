"""Locustfile: one user class per model in TRITON_MODELS ('m1:weight m2:weight').

One model is the single-model suite; several (e.g. a model and its ensemble) is the mixed
workload. LOAD_SHAPE=step adds users in steps; TRITON_RATE_PER_USER>0 makes it open loop.
"""

import os

from tpserve.loadtest.locust_suite import loop_time, slo  # noqa: F401  (the run's clock; the SLO watchdog)
from tpserve.loadtest.locust_suite.shapes import BurstLoad, StepLoad  # noqa: F401
from tpserve.loadtest.locust_suite.user import user_for


def _parse(spec: str):
    for item in spec.split():
        model, _, weight = item.partition(":")
        yield model, int(weight or 1)


globals().update(
    {cls.__name__: cls for cls in (user_for(m, w) for m, w in _parse(os.environ.get("TRITON_MODELS", "")))}
)
