"""policy.load_spread on virtual time: what each bucket holds, exactly.

Times are multiples of 1/8 s (exact in binary), so sums compare exactly.
"""

from __future__ import annotations

import heapq
import random

import pytest

from surge.policy.load_signals import LoadSample, arrival_rate, arrival_slope
from surge.policy.load_spread import (
    MAX_COVER_INTERVALS,
    OFFSET_WINDOW_S,
    Late,
    Offset,
    ReportSpread,
    amend,
)

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


# -- reports that say when they were measured and what they cover ----------------------------


def timed(spread: ReportSpread, source: int, arrivals: float, came: float, measured: float,
          covers: float, every: float = EVERY) -> Late | None:
    return spread.add(source, (arrivals, 0.0, 0.0), came, every, measured, covers)


def test_a_timed_report_is_spread_from_when_its_router_measured_it() -> None:
    # Router clock 100 s behind: the offset is learnt from its reports' smallest delay.
    spread = ReportSpread(TICK)
    assert timed(spread, 1, 20.0, 1.0, -99.0, EVERY) is None  # 40/s over [1.0, 1.5)
    assert spread.take(1.25) == (10.0, 0.0, 0.0)
    # Its next came 0.125 s late (its delay was 0 before): it still covers [1.5, 2.0),
    # the quarter before the open bucket's start (1.25 -> taken at 1.625)...
    assert spread.take(1.5) == (10.0, 0.0, 0.0)
    assert spread.take(1.625) == (0.0, 0.0, 0.0)
    late = timed(spread, 1, 40.0, 1.625, -98.5, EVERY)  # 80/s over [1.5, 2.0)
    assert late == Late(1.5, 1.625, (10.0, 0.0, 0.0))  # ... is returned: a closed bucket's
    assert spread.take(2.0) == (30.0, 0.0, 0.0)
    assert repr(spread) == "<ReportSpread sources=1 spreading=0 rate=0.0/s>"


@pytest.mark.parametrize(("measured", "covers", "expected_rate"), [
    (10.0, 0.5, 16.0),  # what the router says it covers, not the gap between arrivals
    (10.0, 0.25, 32.0),  # an urgent report's short interval
    (10.0, 5.0, 8.0),  # back from idle: at most two told intervals
])
def test_a_timed_report_covers_what_its_router_says(measured: float, covers: float,
                                                    expected_rate: float) -> None:
    spread = ReportSpread(TICK)
    spread.take(10.0)
    timed(spread, 1, 8.0, 10.0, measured, covers)
    assert spread.take(10.125) == (expected_rate * TICK, 0.0, 0.0)


def test_the_smallest_delay_of_the_last_one_to_two_windows_is_kept() -> None:
    assert OFFSET_WINDOW_S == 10.0
    offset = Offset(0.25, 10.0)
    assert offset.update(9.0, 11.0) == Offset(0.25, 10.0)  # came 2 s late: kept
    assert offset.update(10.875, 11.0).delay == 0.125  # a smaller one replaces it at once
    later = offset.update(19.5, 20.0)  # a new window: the last one's best still counts
    assert later == Offset(0.5, 20.0, 0.25) and later.delay == 0.25
    assert later.update(29.5, 30.0).delay == 0.5  # a delay that grew for good is learnt


def test_reports_held_through_a_stall_land_where_they_were_measured() -> None:
    # A router every 0.5 s at 40 req/s; the controller's loop stalls from 2.0 to 3.25:
    # its next tick closes [2.0, 3.25) before it reads the two reports measured at 2.5
    # and 3.0. Their shares in the closed bucket come back as Late, the rest lands
    # after: the bucket after the stall reads 40/s, not the two reports on top of it.
    spread = ReportSpread(TICK)
    timed(spread, 1, 20.0, 1.5, 1.5, EVERY)
    timed(spread, 1, 20.0, 2.0, 2.0, EVERY)  # 40/s over [2.0, 2.5)
    assert spread.take(2.0) == (20.0, 0.0, 0.0)  # [1.5, 2.0)
    assert spread.take(3.25) == (20.0, 0.0, 0.0)  # the stall's bucket, before the reads
    lates = [timed(spread, 1, 20.0, 3.25, 2.5, EVERY), timed(spread, 1, 20.0, 3.25, 3.0,
                                                             EVERY)]
    assert lates == [Late(2.5, 3.0, (20.0, 0.0, 0.0)), Late(3.0, 3.25, (10.0, 0.0, 0.0))]
    assert spread.take(3.375) == (5.0, 0.0, 0.0)  # 40/s: [3.25, 3.5) of the second
    samples = [LoadSample(2.0, 20.0, 0, 0, 0, 0, duration_s=0.5),
               LoadSample(3.25, 20.0, 0, 0, 0, 0, duration_s=1.25)]
    assert [amend(samples, late) for late in lates if late is not None] == [20.0, 10.0]
    assert [s.arrivals / s.duration_s for s in samples] == [40.0, 40.0]


def test_every_tick_a_report_measured_before_the_open_bucket_is_late_whole() -> None:
    spread = ReportSpread(TICK)
    spread.take(1.0)
    assert timed(spread, 1, 4.0, 1.0625, 0.9375, TICK, TICK) is None  # a first: offset 1/8
    assert spread.take(1.125) == (4.0, 0.0, 0.0)
    late = timed(spread, 1, 6.0, 1.5, 0.9375, TICK, TICK)  # measured 1.0625, read at 1.5
    assert late == Late(0.9375, 1.0625, (6.0, 0.0, 0.0))
    assert spread.take(1.5) == (0.0, 0.0, 0.0)
    late = timed(spread, 1, 3.0, 1.75, 1.5, 0.0, TICK)  # covers unknown: as measured now
    assert late is None and spread.take(1.75) == (3.0, 0.0, 0.0)


@pytest.mark.parametrize(("late", "expected", "placed"), [
    # buckets [0.5, 1.0), [1.0, 1.25), [1.25, 1.5)
    (Late(1.0, 1.5, (8.0, 4.0, 2.0)), [0.0, 4.0, 4.0], 8.0),
    (Late(0.75, 1.125, (6.0, 0.0, 0.0)), [4.0, 2.0, 0.0], 6.0),
    (Late(0.0, 0.75, (6.0, 0.0, 0.0)), [2.0, 0.0, 0.0], 2.0),  # older than the series: dropped
    (Late(1.5, 2.0, (6.0, 0.0, 0.0)), [0.0, 0.0, 0.0], 0.0),  # newer: none (the caller's)
])
def test_amend_adds_a_late_share_to_the_buckets_it_overlaps(
        late: Late, expected: list[float], placed: float) -> None:
    samples = [LoadSample(1.0, 0, 0, 0, 0, 0, duration_s=0.5),
               LoadSample(1.25, 0, 0, 0, 0, 0, duration_s=0.25),
               LoadSample(1.5, 0, 0, 0, 0, 0, duration_s=0.25)]
    assert amend(samples, late) == placed
    assert [s.arrivals for s in samples] == expected
    ratio = late.counts[1] / late.counts[0]
    assert [s.completions for s in samples] == [a * ratio for a in expected]


def ramp_through_a_stall(timed_reports: bool) -> list[tuple[float, float]]:
    """1,000 routers every 0.5 s on a ramp of 20,000 req/s per s; the controller's loop
    stalls from 10.0 to 10.6 s: the reports measured meanwhile are read just after its
    tick at 10.6. Per tick after 8 s: (t, the 0.3 s rate / the ramp's rate 0.5 s before),
    read once the held reports are in (the stall's own tick decided before: on less)."""
    rng = random.Random(3)
    routers, start, stall = 1000, 5.0, (10.0, 10.6)
    due = [(start + rng.uniform(0.0, 0.5), i) for i in range(routers)]
    heapq.heapify(due)
    last = dict.fromkeys(range(routers), start)
    spread, samples, held, out, t = ReportSpread(TICK), [], [], [], start
    while t < 14.0:
        end = t + TICK if not stall[0] <= t < stall[1] else stall[1]
        while due[0][0] <= end:
            at, i = heapq.heappop(due)
            arrived = 10_000.0 * ((at - start) ** 2 - (last[i] - start) ** 2) / routers
            report = (i, (arrived, 0.0, 0.0), at, EVERY,
                      at if timed_reports else None, at - last[i])
            last[i] = at
            (held if stall[0] < at < stall[1] else [report]).append(report)
            if not stall[0] < at < stall[1]:
                spread.add(*report)
            heapq.heappush(due, (at + EVERY, i))
        samples.append(LoadSample(end, spread.take(end)[0], 0, 0, 0, 0, duration_s=end - t))
        for i, counts, _, every, measured, covers in held:  # read after the tick
            late = spread.add(i, counts, end, every, measured, covers)
            if late is not None:
                amend(samples, late)
        held, t = [], end
        if t > 8.0:
            out.append((t, arrival_rate(samples, t, 0.3) / (20_000 * (t - start - EVERY))))
    return out


def test_a_stall_does_not_read_a_ramp_high_when_reports_say_when_they_were_measured() -> None:
    # Spread from their arrival, the reports held through the stall land on top of the
    # next ones and the ramp reads high (the controller then scaled past it:
    # bench/control_scale.py); placed where they were measured, it reads the ramp.
    untimed = ramp_through_a_stall(False)
    timed_ = ramp_through_a_stall(True)
    assert max(ratio for t, ratio in untimed if t > 10.6) > 1.4  # (0.37 at the stall, 1.51)
    assert all(0.9 < ratio < 1.1 for _, ratio in timed_)  # (0.92-0.98 here)
