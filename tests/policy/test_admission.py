"""admit / queue_share / retry_after / drain_rate: queues bounded by count or by time,
whose rejections carry numbers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.policy.admission import (
    MAX_RETRY_AFTER_S,
    MIN_RETRY_AFTER_S,
    SERVICE_TIME_WEIGHT,
    Rejection,
    admit,
    drain_rate,
    queue_room,
    queue_share,
    retry_after_header,
    retry_after_s,
    smoothed,
)


@pytest.mark.parametrize(
    ("budget", "routers", "share"),
    [
        (0, 1, 0),  # max_queued_requests=0: no queueing anywhere
        (0, 5, 0),
        (-3, 2, 0),
        (10, 1, 10),
        (10, 0, 10),  # before any router registers, the one asking gets it all
        (10, 3, 3),  # rounded down: the sum stays within the budget
        (10, 10, 1),
        (10, 11, 1),  # more routers than budget: each may still queue one
        (1, 100, 1),
    ],
)
def test_queue_share_table(budget: int, routers: int, share: int) -> None:
    assert queue_share(budget, routers) == share


@given(st.integers(min_value=1, max_value=100_000), st.integers(min_value=1, max_value=1_000))
def test_queue_share_sums_within_budget(budget: int, routers: int) -> None:
    share = queue_share(budget, routers)
    assert 1 <= share <= budget
    if routers <= budget:
        assert share * routers <= budget
        # and nothing is wasted beyond the rounding remainder
        assert budget - share * routers < routers


@given(st.integers(max_value=0), st.integers(min_value=0, max_value=1_000))
def test_queue_share_of_no_budget_is_zero(budget: int, routers: int) -> None:
    assert queue_share(budget, routers) == 0


@pytest.mark.parametrize(
    ("queued", "drain_per_s", "expected"),
    [
        (10, 0.0, MAX_RETRY_AFTER_S),  # nothing drains: wait the longest
        (10, -1.0, MAX_RETRY_AFTER_S),
        (10, 20.0, 0.5),
        (100, 20.0, 5.0),
        (1_000, 20.0, MAX_RETRY_AFTER_S),  # capped
        (0, 20.0, MIN_RETRY_AFTER_S),  # floored: never "retry now"
        (1, 1_000.0, MIN_RETRY_AFTER_S),
        (5, math.inf, MIN_RETRY_AFTER_S),
    ],
)
def test_retry_after_table(queued: int, drain_per_s: float, expected: float) -> None:
    assert retry_after_s(queued, drain_per_s) == pytest.approx(expected)


@given(st.integers(min_value=0, max_value=10**9),
       st.floats(allow_nan=False, min_value=-1e9, max_value=math.inf))
def test_retry_after_is_bounded(queued: int, drain_per_s: float) -> None:
    value = retry_after_s(queued, drain_per_s)
    assert MIN_RETRY_AFTER_S <= value <= MAX_RETRY_AFTER_S


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**6),
       st.floats(min_value=0.0, max_value=1e6))
def test_admit_iff_below_limit(queued: int, limit: int, drain_per_s: float) -> None:
    rejection = admit(queued, limit, drain_per_s)
    if queued < limit:
        assert rejection is None
    else:
        assert rejection is not None
        assert (rejection.queued, rejection.limit) == (queued, limit)
        assert rejection.retry_after_s == retry_after_s(queued, drain_per_s)


def test_rejection_reasons() -> None:
    assert admit(3, 3, 6.0) == Rejection(queued=3, limit=3, retry_after_s=0.5,
                                         reason="queue full")
    no_queue = admit(0, 0, 0.0)
    assert no_queue is not None
    assert no_queue.reason == "no queueing allowed and all replicas busy"
    assert no_queue.retry_after_s == MAX_RETRY_AFTER_S
    assert admit(2, 3, 0.0) is None


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.0, "0"), (0.1, "1"), (0.99, "1"), (1.0, "1"), (1.01, "2"), (2.5, "3"), (10.0, "10"),
     (-4.0, "0"), (MIN_RETRY_AFTER_S, "1")],
)
def test_retry_after_header_rounds_up_and_keeps_a_configured_zero(seconds: float,
                                                                  header: str) -> None:
    """As Ray's: backpressure_config.retry_after_s=0 sends `Retry-After: 0`."""
    assert retry_after_header(seconds) == header


@given(st.floats(min_value=-1e6, max_value=1e6))
def test_retry_after_header_never_early(seconds: float) -> None:
    value = int(retry_after_header(seconds))
    assert value >= 0
    assert value >= seconds
    assert value == 0 if seconds <= 0 else value - 1 < seconds  # never a whole second late



# -- bounded by time (max_queued_requests unset) ------------------------------------------


@pytest.mark.parametrize(
    ("in_flight", "service_s", "rate"),
    [(10, 0.02, 500.0), (1, 0.5, 2.0), (0, 0.02, 0.0), (10, 0.0, 0.0), (-1, 1.0, 0.0)],
)
def test_drain_rate_is_littles_law(in_flight: int, service_s: float, rate: float) -> None:
    assert drain_rate(in_flight, service_s) == pytest.approx(rate)


@pytest.mark.parametrize(
    ("queued", "drain_per_s", "max_wait_s", "service_s", "admitted"),
    [
        (0, 500.0, 0.1, 0.02, True),     # waits 2 ms
        (49, 500.0, 0.1, 0.02, True),    # the 50th waits exactly 100 ms
        (50, 500.0, 0.1, 0.02, False),   # the 51st would wait 102 ms
        (0, 2.0, 0.1, 0.5, True),        # a slow model: waiting one service time is fine
        (1, 2.0, 0.1, 0.5, False),       # ... two is not
        (5, 0.0, 0.1, 0.0, True),        # nothing known yet (cold start): count only
        (10_000, 0.0, 0.1, 0.0, False),  # ... and the count still bounds it
        (10_000, 500.0, None, 0.02, False),
        (5_000, 500.0, None, 0.02, True),  # no wait bound: count only
    ],
)
def test_admit_by_wait_table(queued: int, drain_per_s: float, max_wait_s: float | None,
                             service_s: float, admitted: bool) -> None:
    rejection = admit(queued, 10_000, drain_per_s, max_wait_s, service_s)
    assert (rejection is None) is admitted


def test_a_wait_rejection_says_why_and_when_to_come_back() -> None:
    rejection = admit(50, 10_000, 500.0, 0.1, 0.02)
    assert rejection is not None
    assert rejection.retry_after_s == pytest.approx(0.1)  # 50 queued at 500/s
    assert "would wait ~0.102s" in rejection.reason
    assert "max_queue_wait_s (0.1s)" in rejection.reason


@given(st.integers(min_value=0, max_value=10**5), st.floats(min_value=0.1, max_value=1e5),
       st.floats(min_value=0.001, max_value=10.0), st.floats(min_value=0.0, max_value=10.0))
def test_admitted_requests_wait_within_the_bound(queued: int, drain_per_s: float,
                                                 max_wait_s: float, service_s: float) -> None:
    rejection = admit(queued, 10**6, drain_per_s, max_wait_s, service_s)
    wait = (queued + 1) / drain_per_s
    budget = max(max_wait_s, service_s)
    if rejection is None:
        assert wait <= budget * (1 + 1e-9)
    else:
        assert wait > budget * (1 - 1e-9)
        assert MIN_RETRY_AFTER_S <= rejection.retry_after_s <= MAX_RETRY_AFTER_S


@given(st.integers(min_value=0, max_value=10**5), st.floats(min_value=0.1, max_value=1e5),
       st.floats(min_value=0.001, max_value=10.0))
def test_admission_by_wait_is_monotone_in_queue_length(queued: int, drain_per_s: float,
                                                       max_wait_s: float) -> None:
    """Once a queue length is refused, every longer one is refused too."""
    if admit(queued, 10**6, drain_per_s, max_wait_s) is not None:
        assert admit(queued + 1, 10**6, drain_per_s, max_wait_s) is not None


@pytest.mark.parametrize(
    ("drain_per_s", "max_wait_s", "service_s", "room"),
    [(500.0, 0.1, 0.02, 50), (40.0, 0.1, 0.05, 4), (2.0, 0.1, 0.5, 1), (1.0, 0.1, 0.5, 0),
     (0.0, 0.1, 0.02, None), (500.0, None, 0.02, None),
     (500.0, math.inf, 0.02, None), (1e300, 1e300, 0.02, None)],  # unbounded: no bound
)
def test_queue_room(drain_per_s: float, max_wait_s: float | None, service_s: float,
                    room: int | None) -> None:
    assert queue_room(drain_per_s, max_wait_s, service_s) == room


def test_smoothed_service_time() -> None:
    assert smoothed(0.0, 0.03) == 0.03  # the first sample is taken whole
    assert smoothed(0.02, 0.04) == pytest.approx(0.02 + SERVICE_TIME_WEIGHT * 0.02)
    estimate = 0.02
    for _ in range(100):  # a lasting change is followed
        estimate = smoothed(estimate, 0.2)
    assert estimate == pytest.approx(0.2, rel=0.01)
