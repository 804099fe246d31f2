"""The control loop's cadence, shared by the controller, the simulator and the routers.

Its own module so that a router (in every driver and proxy) reads these numbers
without importing the autoscaling policies (policy/autoscale_step.py re-exports them).
"""

from __future__ import annotations

import math

__all__ = ["LOAD_REPORTS_PER_S", "MAX_LOAD_REPORT_INTERVAL_S", "TICK_S",
           "URGENT_DECISION_INTERVAL_S", "URGENT_REPORT_DELAY_S", "load_report_interval_s"]

# The control loop's tick, and the length of one load sample.
TICK_S = 0.1
# A router whose queue starts to grow reports after this (the burst's first few ms).
URGENT_REPORT_DELAY_S = 0.005
# At most one out-of-tick decision per deployment in this interval.
URGENT_DECISION_INTERVAL_S = 0.02
# Routers report their load every tick, as long as all of them together send at most
# this many reports a second; more routers report less often (a tick more per step),
# so a controller with 1,000 routers is not drowned by 10,000 reports a second. Urgent
# reports (a queue starting to grow) are never held back.
LOAD_REPORTS_PER_S = 2_000
MAX_LOAD_REPORT_INTERVAL_S = 2.0


def load_report_interval_s(routers: int) -> float:
    """How often each of `routers` routers reports: a whole number of ticks."""
    ticks = max(1, math.ceil(routers / (LOAD_REPORTS_PER_S * TICK_S)))
    return min(MAX_LOAD_REPORT_INTERVAL_S, round(ticks * TICK_S, 3))
