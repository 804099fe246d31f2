"""The control loop's cadence, shared by the controller, the simulator and the routers.

Its own module so that a router (in every driver and proxy) reads these numbers
without importing the autoscaling policies (policy/autoscale_step.py re-exports them).
"""

from __future__ import annotations

import math

__all__ = ["LOAD_REPORTS_PER_S", "MAX_LOAD_REPORT_INTERVAL_S", "MAX_TELEMETRY_INTERVAL_S",
           "TELEMETRY_INTERVAL_S", "TELEMETRY_KEEPALIVE_S", "TELEMETRY_REPORTS_PER_S",
           "TICK_S", "URGENT_DECISION_INTERVAL_S", "URGENT_REPORT_DELAY_S", "heard_lately",
           "load_report_interval_s", "telemetry_interval_s"]

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


# Members (replicas, proxies) send their telemetry every TELEMETRY_INTERVAL_S; an idle
# one's report (no counts, the gauges of the last one sent) at most every
# TELEMETRY_KEEPALIVE_S, so hundreds of idle replicas cost the controller little. The
# keepalive stays below the observer's STALE_GAUGE_S (10 s), after which it forgets a
# proxy's gauges. Past TELEMETRY_REPORTS_PER_S members in all, each reports less often
# (whole seconds, at most MAX_TELEMETRY_INTERVAL_S; pushed to them as
# `telemetry_interval`): 11,000 members every 5 s rather than 11,000 reports a second.
TELEMETRY_INTERVAL_S = 1.0
TELEMETRY_KEEPALIVE_S = 5.0
TELEMETRY_REPORTS_PER_S = 1_000
MAX_TELEMETRY_INTERVAL_S = TELEMETRY_KEEPALIVE_S


def telemetry_interval_s(members: int) -> float:
    """How often each of `members` members sends its telemetry."""
    seconds = max(1, math.ceil(members / (TELEMETRY_REPORTS_PER_S * TELEMETRY_INTERVAL_S)))
    return min(MAX_TELEMETRY_INTERVAL_S, seconds * TELEMETRY_INTERVAL_S)


def heard_lately(heard_at: float, now: float, period_s: float, interval_s: float) -> bool:
    """Whether a replica's telemetry, last heard at `heard_at`, passes its default health
    check due `now` (its class has no check_health of its own).

    A report proves the replica's event loop ran its timer then: what Ray's default
    check proves (the replica answers). It passes when heard within the check period
    and within a keepalive and two report intervals (`interval_s`: what members were
    told), so a replica that went silent is called, as any other, by the next check."""
    return now - heard_at <= min(period_s, TELEMETRY_KEEPALIVE_S + 2 * interval_s)
