"""policy.cadence: how often routers report their load, from how many there are."""

from __future__ import annotations

import pytest

from surge.policy.cadence import (
    LOAD_REPORTS_PER_S,
    MAX_LOAD_REPORT_INTERVAL_S,
    TICK_S,
    load_report_interval_s,
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
