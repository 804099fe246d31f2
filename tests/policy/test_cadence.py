"""policy.cadence: how often routers report their load and members their telemetry,
from how many there are, and when a replica's telemetry stands for its health check."""

from __future__ import annotations

import math

import pytest

from surge.policy.cadence import (
    LOAD_REPORTS_PER_S,
    MAX_LOAD_REPORT_INTERVAL_S,
    MAX_TELEMETRY_INTERVAL_S,
    TELEMETRY_INTERVAL_S,
    TELEMETRY_KEEPALIVE_S,
    TELEMETRY_REPORTS_PER_S,
    TICK_S,
    heard_lately,
    load_report_interval_s,
    telemetry_interval_s,
)


@pytest.mark.parametrize(("routers", "interval_s", "why"), [
    (0, TICK_S, "none yet: every tick"),
    (1, TICK_S, "one router: every tick"),
    (64, TICK_S, "the seed's 64 proxies: 640 reports/s, every tick"),
    (200, TICK_S, "2,000 reports/s: still every tick"),
    (201, 0.2, "one more: every other tick"),
    (1000, 0.5, "1,000 routers: 2,000 reports/s at one per 5 ticks"),
    (4000, MAX_LOAD_REPORT_INTERVAL_S, "many: never rarer than the cap"),
    (10**6, MAX_LOAD_REPORT_INTERVAL_S, "many: never rarer than the cap"),
])
def test_report_interval(routers: int, interval_s: float, why: str) -> None:
    assert load_report_interval_s(routers) == interval_s, why


def test_the_reports_stay_within_the_budget_until_the_cap() -> None:
    for routers in range(4001):
        interval = load_report_interval_s(routers)
        assert interval >= TICK_S
        if interval < MAX_LOAD_REPORT_INTERVAL_S:
            assert routers / interval <= LOAD_REPORTS_PER_S * (1 + 1e-9), routers


@pytest.mark.parametrize(("members", "interval_s", "why"), [
    (0, 1.0, "none yet: every second"),
    (576, 1.0, "the seed's 512 replicas and 64 proxies: every second"),
    (1000, 1.0, "1,000 reports/s: still every second"),
    (1001, 2.0, "one more: every other second"),
    (2250, 3.0, "2,000 replicas and 250 proxies: every 3 s"),
    (11000, MAX_TELEMETRY_INTERVAL_S, "10,000 replicas and 1,000 proxies: the cap"),
])
def test_telemetry_interval(members: int, interval_s: float, why: str) -> None:
    assert telemetry_interval_s(members) == interval_s, why


def test_telemetry_stays_within_its_budget_until_the_cap() -> None:
    for members in range(20001):
        interval = telemetry_interval_s(members)
        assert TELEMETRY_INTERVAL_S <= interval <= MAX_TELEMETRY_INTERVAL_S
        assert interval == int(interval)  # whole seconds
        if interval < MAX_TELEMETRY_INTERVAL_S:
            assert members / interval <= TELEMETRY_REPORTS_PER_S, members


@pytest.mark.parametrize(("ago_s", "period_s", "interval_s", "passes", "why"), [
    (0.0, 10.0, 1.0, True, "heard just now"),
    (5.0, 10.0, 1.0, True, "an idle replica's keepalive"),
    (7.0, 10.0, 1.0, True, "a keepalive two reports late"),
    (7.5, 10.0, 1.0, False, "later than that: a call checks it"),
    (1.5, 1.0, 1.0, False, "never older than the user's own period"),
    (9.0, 10.0, MAX_TELEMETRY_INTERVAL_S, True, "members told to report every 5 s"),
    (10.5, 10.0, MAX_TELEMETRY_INTERVAL_S, False, "older than the period"),
    (float("inf"), 10.0, 1.0, False, "never heard (metrics off: no telemetry)"),
])
def test_heard_lately(ago_s: float, period_s: float, interval_s: float, passes: bool,
                      why: str) -> None:
    now = 1000.0
    assert heard_lately(now - ago_s, now, period_s, interval_s) is passes, why


def test_a_keepalive_on_any_interval_is_heard_lately() -> None:
    """An idle member reports at the first tick of its timer at or past the keepalive,
    ceil(K / I) * I after the last; a report a tick late still passes (Ray's period)."""
    for interval in (1.0, 2.0, 3.0, 4.0, MAX_TELEMETRY_INTERVAL_S):
        gap = math.ceil(TELEMETRY_KEEPALIVE_S / interval) * interval
        assert heard_lately(1000.0 - gap, 1000.0, 10.0, interval), interval
        assert heard_lately(1000.0 - gap - interval, 1000.0, 10.0, interval) or \
            gap + interval > 10.0, interval
