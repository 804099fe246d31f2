"""The control loop's cadence, shared by the controller, the simulator and the routers.

Its own module so that a router (in every driver and proxy) reads these three numbers
without importing the autoscaling policies (policy/autoscale_step.py re-exports them).
"""

from __future__ import annotations

__all__ = ["TICK_S", "URGENT_DECISION_INTERVAL_S", "URGENT_REPORT_DELAY_S"]

# The control loop's tick, and the length of one load sample.
TICK_S = 0.1
# A router whose queue starts to grow reports after this (the burst's first few ms).
URGENT_REPORT_DELAY_S = 0.005
# At most one out-of-tick decision per deployment in this interval.
URGENT_DECISION_INTERVAL_S = 0.02
