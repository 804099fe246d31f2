"""policy.load_spread on virtual time: what each bucket holds, exactly.

Times are multiples of 1/8 s (exact in binary), so sums compare exactly.
"""

from __future__ import annotations

import heapq
import random

import pytest

from surge.policy.autoscaling import LoadSample, arrival_rate, arrival_slope
from surge.policy.load_spread import MAX_COVER_INTERVALS, ReportSpread

TICK = 0.125
EVERY = 0.5  # told interval: four ticks


def test_reports_every_tick_and_a_first_report_land_whole() -> None:
    spread = ReportSpread(TICK)
    spread.add(1, (8.0, 4.0, 1.0), 1.0, TICK)
    spread.add(1, (2.0, 2.0, 0.0), 1.125, TICK)  # every tick: as before, no spreading
    spread.add(2, (16.0, 0.0, 0.0), 1.125, EVERY)  # its first report: nothing to spread
    assert spread.take(1.125) == (26.0, 6.0, 1.0)
    assert spread.take(1.25) == (0.0, 0.0, 0.0)
    assert repr(spread) == "<ReportSpread sources=2 spreading=0 rate=0.0/s>"


def test_a_report_is_spread_over_the_time_since_the_same_routers_previous_one() -> None:
    spread = ReportSpread(TICK)
    spread.add(1, (0.0, 0.0, 0.0), 1.0, EVERY)
    spread.add(1, (40.0, 20.0, 4.0), 1.5, EVERY)  # covers 0.5 s: 80 req/s until 2.0
    assert repr(spread) == "<ReportSpread sources=1 spreading=1 rate=80.0/s>"
    rows = [(1.5, (0.0, 0.0, 0.0)), (1.625, (10.0, 5.0, 1.0)), (1.75, (10.0, 5.0, 1.0)),
            (2.0, (20.0, 10.0, 2.0)), (2.125, (0.0, 0.0, 0.0))]
    for now, counts in rows:
        assert spread.take(now) == counts, f"at {now}"


def test_peek_reads_the_open_bucket_and_take_empties_it() -> None:
    spread = ReportSpread(TICK)
    spread.add(7, (0.0, 0.0, 0.0), 0.0, EVERY)
    spread.add(7, (32.0, 0.0, 0.0), 0.5, EVERY)  # 64 req/s until 1.0
    assert spread.peek(0.5625) == (4.0, 0.0, 0.0)
    assert spread.peek(0.625) == (8.0, 0.0, 0.0)
    assert spread.peek(0.5) == (8.0, 0.0, 0.0)  # a clock read earlier changes nothing
    assert spread.take(0.625) == (8.0, 0.0, 0.0)
    assert spread.take(1.5) == (24.0, 0.0, 0.0)  # the rest, up to its end at 1.0


def test_a_report_covers_at_most_two_told_intervals() -> None:
    # Quiet for 10 s, then a report: it covers 2 x 0.5 s, not 10 s.
    assert MAX_COVER_INTERVALS == 2.0
    spread = ReportSpread(TICK)
    spread.add(1, (5.0, 0.0, 0.0), 0.0, EVERY)
    assert spread.take(0.125) == (5.0, 0.0, 0.0)
    spread.add(1, (50.0, 0.0, 0.0), 10.0, EVERY)
    assert spread.take(10.5) == (25.0, 0.0, 0.0)
    assert spread.take(11.0) == (25.0, 0.0, 0.0)


def test_overlapping_spreads_add_up_and_end_each_at_its_time() -> None:
    spread = ReportSpread(TICK)
    for source in (1, 2):
        spread.add(source, (0.0, 0.0, 0.0), 0.0, EVERY)
    spread.add(1, (8.0, 0.0, 0.0), 0.5, EVERY)  # 16/s over [0.5, 1.0)
    spread.add(2, (12.0, 0.0, 0.0), 0.75, EVERY)  # covers 0.75 s: 16/s over [0.75, 1.5)
    assert [spread.take(t)[0] for t in (0.75, 1.0, 1.25, 1.5, 1.75)] == [4.0, 8.0, 4.0, 4.0,
                                                                        0.0]


def test_a_gone_router_is_forgotten_but_what_it_reported_still_counts() -> None:
    spread = ReportSpread(TICK)
    spread.add(1, (0.0, 0.0, 0.0), 0.0, EVERY)
    spread.add(1, (16.0, 0.0, 0.0), 0.5, EVERY)
    spread.forget(1)
    spread.forget(9)  # never seen: nothing to do
    spread.add(1, (3.0, 0.0, 0.0), 0.75, EVERY)  # a new connection's first report: whole
    assert spread.take(1.0) == (16.0 + 3.0, 0.0, 0.0)


def series_of_bunched_routers(spread: ReportSpread | None) -> tuple[list[LoadSample], float]:
    """1,000 routers whose 0.5 s timers start within 0.1 s, on a ramp of 20,000 req/s per
    s; buckets every 0.1 s plus up to 20 ms (a tick's own time), each from the previous
    one's end: landed whole (spread None), or spread; and what was still spreading."""
    rng = random.Random(7)
    routers, start = 1000, 5.0

    def offered(t: float) -> float:  # requests offered in all up to t
        return 10_000.0 * max(0.0, t - start) ** 2

    due = [(start + rng.uniform(0.0, 0.1), i) for i in range(routers)]
    heapq.heapify(due)
    last = {i: start for i in range(routers)}
    samples, t, whole = [], start, 0.0
    while t < 15.0:
        end = t + 0.1 + rng.uniform(0.0, 0.02)
        while due[0][0] <= end:
            at, i = heapq.heappop(due)
            arrived = (offered(at) - offered(last[i])) / routers
            last[i] = at
            if spread is None:
                whole += arrived
            else:
                spread.add(i, (arrived, 0.0, 0.0), at, EVERY)
            heapq.heappush(due, (at + EVERY + rng.uniform(0.0, 0.004), i))
        arrivals = whole if spread is None else spread.take(end)[0]
        whole = 0.0
        samples.append(LoadSample(end, arrivals, 0.0, 0.0, 0.0, 0.0, duration_s=end - t))
        t = end
    return samples, 0.0 if spread is None else spread.take(t + 60.0)[0]


def test_bunched_routers_on_a_smooth_ramp_read_as_the_ramp() -> None:
    # The ramp: 20,000 req/s per s. Landed whole, the comb of bunched reports reads a
    # slope tens of times that in some windows; spread, within a third of it in every
    # 1 s window after the first seconds.
    whole, _ = series_of_bunched_routers(None)
    spread, later = series_of_bunched_routers(ReportSpread(TICK))
    assert sum(s.arrivals for s in spread) + later == pytest.approx(
        sum(s.arrivals for s in whole))  # every request counted once, some later

    def slopes(samples: list[LoadSample]) -> list[float]:
        return [arrival_slope(samples[:k + 1], samples[k].t, 1.0)
                for k in range(len(samples)) if samples[k].t > 7.0]

    assert max(slopes(whole)) > 200_000
    assert all(13_000 < slope < 27_000 for slope in slopes(spread))
    # The rate lags the ramp by up to a report interval (what the spreading costs).
    last = spread[-1].t
    assert 20_000 * (last - 5.0 - EVERY - 0.3) < arrival_rate(spread, last, 0.3) \
        < 20_000 * (last - 5.0)
