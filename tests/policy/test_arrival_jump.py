"""When a router's arrivals jump (policy/arrival_jump.py): table tests on a fake clock.

The watch's recent rate follows its reports; an arrival is a jump when the last 2, 3 or
4 arrivals came within the span a Poisson stream at that rate gives JUMP_P of the time
(QUANTILES / rate); one jump a report at most. The rate a jump implies (`jump_rate`) is
only set on SIZE_ARRIVALS arrivals within SIZE_QUANTILE mean gaps, on a stream that is
not bursty (gaps' CV2 at most BURSTY_CV2), once a report.
"""

from __future__ import annotations

import math
import random

import pytest

from surge.policy.arrival_jump import (
    BURSTY_CV2,
    JUMP_P,
    MIN_RATE,
    QUANTILES,
    RATE_WINDOW_S,
    SIZE_ARRIVALS,
    SIZE_P,
    SIZE_QUANTILE,
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


def test_the_size_quantile_is_the_span_of_six_arrivals_one_time_in_ten_thousand() -> None:
    assert (SIZE_ARRIVALS, SIZE_P) == (6, 1e-4)
    span = SIZE_QUANTILE  # in mean gaps
    assert span == pytest.approx(poisson_quantile(5, 1e-4))
    assert span == pytest.approx(0.4445, abs=1e-4)  # 44 ms at 10 req/s


@pytest.mark.parametrize(("gaps_ms", "rate_at", "rate"), [
    # 10 req/s evenly lately (44.4 ms for six arrivals): five gaps of 5 ms, a rate of
    # (6 - 2) / 25 ms; the first jump (2 within 1 ms... no: 3 within 14.9 ms) came before
    ([5, 5, 5, 5, 5], 5, 160.0),
    ([2, 2, 2, 2, 2], 5, 400.0),
    ([8, 8, 8, 8, 8], 5, 100.0),  # 40 ms: just within
    ([9, 9, 9, 9, 9], None, 0.0),  # 45 ms: a jump, but no rate
    ([9, 9, 9, 9, 9, 1], 6, 4 / 0.037),  # ... until the last six come within 37 ms
])
def test_a_run_of_six_within_their_span_sets_the_rate(gaps_ms: list[int], rate_at: int | None,
                                                       rate: float) -> None:
    watch, last = steady(10.0)
    assert watch.cv2 < 0.6  # even: not bursty (the CV2 of 1 it assumes at first fades)
    t, set_at = last + 0.1, None
    assert not watch.arrived(t)
    for k, gap in enumerate(gaps_ms, 1):
        t += gap / 1000
        if watch.arrived(t) and watch.jump_rate > 0 and set_at is None:
            set_at = k
    assert set_at == rate_at
    assert watch.jump_rate == pytest.approx(rate)
    assert f"jump_rate={rate:.1f}/s" in repr(watch)


def test_the_rate_is_set_once_a_report_and_spent_by_the_next() -> None:
    watch, last = steady(10.0)
    t = last + 0.1
    for _ in range(6):
        watch.arrived(t)
        t += 0.005
    assert watch.jump_rate == pytest.approx(160.0)
    assert not watch.arrived(t)  # a 7th as close: reported already
    watch.reported(6, 0.03, rearm=False)  # the urgent report carried it
    assert watch.jump_rate == 0.0
    assert not watch.arrived(t + 0.005)  # not rearmed
    watch.reported(0, 0.0)  # a regular report (covering nothing): rearmed
    assert watch.arrived(t + 0.01)
    assert watch.jump_rate == pytest.approx(4 / 0.025)


def test_a_bursty_stream_sets_no_rate() -> None:
    """Gamma gaps of shape 0.25 (CV2 4, bench/llm_sim_targets.py's replay) at 6 req/s:
    runs of six close arrivals come often, and read as 20x the rate; no rate is set."""
    rng, watch = random.Random(4), ArrivalWatch()
    watch.reported(120, 20.0)
    t, next_report, count, rated, jumps = 0.0, 0.1, 0, 0, 0
    while t < 600.0:
        t += rng.gammavariate(0.25, 4 / 6)
        while next_report <= t:
            watch.reported(count, 0.1)
            count, next_report = 0, next_report + 0.1
        count += 1
        if watch.arrived(t):
            jumps += 1
            rated += watch.jump_rate > 0
    assert watch.cv2 > BURSTY_CV2
    assert jumps > 100  # it jumps (and so reports early) often...
    assert rated == 0  # ... but never says how fast


def test_a_poisson_stream_rarely_sets_a_rate() -> None:
    """10 req/s Poisson for 20 minutes: a rate set a few times at most (SIZE_P per
    arrival at most: 12,000 arrivals)."""
    rng, watch = random.Random(5), ArrivalWatch()
    watch.reported(200, 20.0)
    t, next_report, count, rated, arrivals = 0.0, 0.1, 0, 0, 0
    while t < 1200.0:
        t += rng.expovariate(10.0)
        while next_report <= t:
            watch.reported(count, 0.1)
            count, next_report = 0, next_report + 0.1
        count, arrivals = count + 1, arrivals + 1
        rated += watch.arrived(t) and watch.jump_rate > 0
    assert watch.cv2 == pytest.approx(1.0, abs=0.5)
    assert rated <= arrivals * SIZE_P * 2


def test_a_16x_poisson_step_sets_its_rate_within_its_first_requests() -> None:
    """10 req/s Poisson, then 160 req/s: the rate is set within the step's first 100 ms
    in 9 of 10 steps or more, and reads within 2x of 160 in most."""
    rng = random.Random(6)
    within, close = 0, 0
    for _ in range(50):
        watch = ArrivalWatch()
        watch.reported(200, 20.0)
        t, next_report, count = 0.0, 0.1, 0
        while t < 20.0:
            t += rng.expovariate(10.0)
            while next_report <= t:
                watch.reported(count, 0.1)
                count, next_report = 0, next_report + 0.1
            count += 1
            watch.arrived(t)
        watch.reported(count, t - next_report + 0.1)
        step = t
        while t < step + 0.1:
            t += rng.expovariate(160.0)
            if watch.arrived(t) and watch.jump_rate > 0:
                within += 1
                close += 80.0 <= watch.jump_rate <= 320.0
                break
    assert within >= 45
    assert close >= 40
