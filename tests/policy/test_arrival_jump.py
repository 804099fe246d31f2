"""When a router's arrivals jump (policy/arrival_jump.py): table tests on a fake clock.

The watch's recent rate follows its reports; an arrival is a jump when the last 2, 3 or
4 arrivals came within the span a Poisson stream at that rate gives JUMP_P of the time
(QUANTILES / rate); one jump a report at most.
"""

from __future__ import annotations

import math
import random

import pytest

from surge.policy.arrival_jump import (
    JUMP_P,
    MIN_RATE,
    QUANTILES,
    RATE_WINDOW_S,
    ArrivalWatch,
    poisson_quantile,
)


def steady(rate: float, seconds: float = 20.0,
           report_s: float = 0.1) -> tuple[ArrivalWatch, float]:
    """A watch that saw `rate` over the last 20 s, fed evenly spaced arrivals at `rate`
    and a report every `report_s` for `seconds`, its last arrival at the returned time
    (no jump on the way)."""
    watch = ArrivalWatch()
    watch.reported(rate * 20, 20.0)
    gap, t, next_report, last = 1.0 / rate, 0.0, report_s, 0.0
    count = 0
    while t < seconds:
        while next_report <= t:
            watch.reported(count, report_s)
            count, next_report = 0, next_report + report_s
        assert not watch.arrived(t), f"an even {rate} req/s stream read as a jump at {t}"
        count, last = count + 1, t
        t += gap
    return watch, last


@pytest.mark.parametrize(("n", "p"), [(1, 0.01), (2, 0.01), (3, 0.01), (2, 0.5), (5, 0.001)])
def test_the_quantile_is_the_mean_at_which_n_arrivals_come_with_that_chance(n: int,
                                                                           p: float) -> None:
    m = poisson_quantile(n, p)
    reached = 1.0 - sum(math.exp(-m) * m**i / math.factorial(i) for i in range(n))
    assert reached == pytest.approx(p, rel=1e-6)


def test_the_quantiles_are_the_spans_in_mean_gaps_for_two_three_and_four_arrivals() -> None:
    # one more arrival within 1% of a mean gap, two more within 0.149, three within 0.436
    assert list(QUANTILES) == pytest.approx([-math.log(1 - JUMP_P), 0.14855, 0.43605], rel=1e-4)


def test_the_recent_rate_follows_the_reports() -> None:
    watch = ArrivalWatch()
    assert watch.rate == 0.0
    watch.reported(5, 0.1)  # 50 req/s for 0.1 s: weighted by 1 - e^(-0.1 / 2)
    assert watch.rate == pytest.approx(50 * (1 - math.exp(-0.1 / RATE_WINDOW_S)))
    for _ in range(200):  # 20 s at 16 req/s
        watch.reported(1.6, 0.1)
    assert watch.rate == pytest.approx(16.0, rel=1e-3)
    watch.reported(0, 0.0)  # covers nothing: the rate stays
    assert watch.rate == pytest.approx(16.0, rel=1e-3)
    assert "rate=16.00/s" in repr(watch)


@pytest.mark.parametrize(("gaps_ms", "jump_at"), [
    # 1 req/s lately (a mean gap of 1 s)
    ([1000], None),  # the next on time
    ([1000, 5], 1),  # two within 5 ms: 0.005 mean gaps < 0.01
    ([1000, 20], None),  # two within 20 ms: not improbable enough alone
    ([1000, 20, 100], 2),  # three within 120 ms: < 0.149 mean gaps
    ([1000, 100, 100], None),  # three within 200 ms: no...
    ([1000, 100, 100, 100], 3),  # ... four within 300 ms: < 0.436
    ([1000, 150, 150, 150], None),  # four within 450 ms: a rate of ~7 for 1 s is not
])
def test_a_jump_is_arrivals_closer_than_the_recent_rate_makes_likely(
        gaps_ms: list[int], jump_at: int | None) -> None:
    watch = ArrivalWatch()
    watch.reported(20, 20.0)  # 1 req/s over 20 s (its EWMA: 1 x (1 - e^-10))
    t, jumps = 100.0, []
    for k, gap in enumerate(gaps_ms):
        t += gap / 1000
        if watch.arrived(t):
            jumps.append(k)
    assert jumps == ([] if jump_at is None else [jump_at])


def test_one_jump_a_report_and_only_a_regular_report_rearms() -> None:
    watch = ArrivalWatch()
    watch.reported(20, 20.0)
    assert not watch.arrived(10.0)
    assert watch.arrived(10.001)  # two within 1 ms at 1 req/s
    assert not watch.arrived(10.002)  # the same jump: reported already
    watch.reported(3, 0.01, rearm=False)  # the urgent report it caused
    assert not watch.arrived(10.003)
    watch.reported(0, 0.09)  # the regular one
    assert "armed=True" in repr(watch)
    assert watch.arrived(10.0031)


def test_an_idle_router_counts_as_seeing_the_least_rate() -> None:
    watch = ArrivalWatch()  # nothing yet: MIN_RATE, spans of QUANTILES / MIN_RATE
    assert not watch.arrived(0.0)
    assert watch.arrived(0.9 * QUANTILES[0] / MIN_RATE)


@pytest.mark.parametrize("rate", [1.0, 16.0, 500.0])
def test_an_even_stream_never_jumps(rate: float) -> None:
    steady(rate)


@pytest.mark.parametrize("rate", [1.0, 16.0, 200.0])
def test_a_poisson_stream_jumps_about_as_often_as_the_tests_allow(rate: float) -> None:
    """Steady Poisson arrivals at `rate`, a report every 0.1 s: fewer jumps than the
    three tests' JUMP_P each per arrival (they overlap, and one a report at most)."""
    rng, watch = random.Random(3), ArrivalWatch()
    watch.reported(rate * 20, 20.0)
    t, next_report, count, jumps, arrivals = 0.0, 0.1, 0, 0, 0
    while t < 2000 / rate:
        t += rng.expovariate(rate)
        while next_report <= t:
            watch.reported(count, 0.1)
            count, next_report = 0, next_report + 0.1
        count, arrivals = count + 1, arrivals + 1
        jumps += watch.arrived(t)
    assert 0 < jumps / arrivals < len(QUANTILES) * JUMP_P


def test_a_16x_step_jumps_within_its_first_few_requests() -> None:
    """1 req/s evenly, then 16 req/s: the step's 2nd request 9 ms after its first is a
    jump at once; spaced 116 / 89 / 34 ms apart (bench/llm_objectives.py's seed 0), the
    4th is."""
    for gaps, expected in (([9, 118, 90], 1), ([116, 89, 34, 19], 3)):
        watch, last = steady(1.0)
        t, found = last + 1.0, None  # the step's first request, on time
        assert not watch.arrived(t)
        for k, gap in enumerate(gaps, 1):
            t += gap / 1000
            if watch.arrived(t):
                found = k
                break
        assert found == expected
