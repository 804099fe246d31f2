"""Router load reports spread over the time they cover, for one deployment's buckets.

A router reports its counters (arrivals, completions, rejections) since its previous
report every load interval (policy/cadence.load_report_interval_s: every tick up to 200
routers, 0.5 s at 1,000), and says when it measured them and how long they cover, by
its own clock (`LoadReport.measured_at`, `.covers_s`). Landed whole in the tick's bucket
where they arrive, reports every 0.5 s from routers whose timers started together make
the bucket series a comb, and the rate's slope over 1 s reads a smooth ramp as a surge
(bench/control_scale.py at 10,000 replicas x 1,000 routers). So `ReportSpread` spreads
each report at its rate over the `covers_s` after it was measured: a steady router adds
a constant rate, however the timers line up, and a step is seen one report interval
late at most. Reports while routers report every tick land whole in the open bucket,
with no delay.

Times are the router's: a report's measurement time is moved onto this clock by the
smallest delay its router's reports have shown (`Offset`, a clock of another machine
included), not by when it arrived. A report the controller read late (its loop stalled
while the reports queued) still lands where it was measured: the share of it that
falls in buckets already closed is `Late`, which the caller adds to those buckets
(`amend`), so no bucket after a stall holds the reports held back during it, and the
bucket of the stall holds them. (Spread from its arrival instead, as until 2026-12-06,
the reports held back were spread on top of the next ones: bench/control_scale.py read
a ramp's rate 18-39% high after a stall and scaled past it.)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import MutableSequence
from dataclasses import dataclass, replace

from surge.policy.load_signals import LoadSample

__all__ = ["MAX_COVER_INTERVALS", "OFFSET_WINDOW_S", "Counts", "Late", "Offset", "ReportSpread",
           "amend"]

Counts = tuple[float, float, float]  # arrivals, completions, rejections

# A report covers at most this many told intervals: a late timer's report is still
# spread whole, a router back from idle does not dilute its first report.
MAX_COVER_INTERVALS = 2.0
# The smallest delay is kept over the last one to two windows of this length, so that
# a delay that grew for good (a longer path, two machines' clocks drifting apart) is
# learnt within two windows; a smaller one replaces it at once.
OFFSET_WINDOW_S = 10.0


@dataclass(frozen=True)
class Offset:
    """This clock minus a router's, plus the smallest transit delay seen lately: the
    smallest (arrival - measured_at) of the window that began at `since` and of the
    one before it."""

    best: float  # in this window
    since: float
    before: float = float("inf")  # in the previous window

    @property
    def delay(self) -> float:
        return min(self.best, self.before)

    def update(self, measured_at: float, now: float) -> Offset:
        delay = now - measured_at
        if now - self.since >= OFFSET_WINDOW_S:
            return Offset(delay, now, self.best)
        return Offset(min(delay, self.best), self.since, self.before)


@dataclass(frozen=True)
class Late:
    """The share of a report that lies in buckets already closed: `counts` over
    [start, end) on this clock."""

    start: float
    end: float
    counts: Counts


class ReportSpread:
    """Counters of one deployment's reports, integrated over the time each covers."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self._offsets: dict[int, Offset] = {}  # source -> its clock's offset
        self._last: dict[int, float] = {}  # source -> when its previous report came
        self._added = [0.0, 0.0, 0.0]  # in the open bucket so far
        self._rate = [0.0, 0.0, 0.0]  # per second, of the spreads running at `_at`
        self._ends: list[tuple[float, int, Counts]] = []  # (end, order, rate): a heap
        self._order = itertools.count()
        self._at = -float("inf")  # integrated up to here
        self._opened = -float("inf")  # the open bucket's start (the last `take`)

    def __repr__(self) -> str:
        return (f"<ReportSpread sources={len(self._last)} spreading={len(self._ends)} "
                f"rate={self._rate[0]:.1f}/s>")

    def add(self, source: int, counts: Counts, now: float, interval_s: float,
            measured_at: float | None = None, covers_s: float = 0.0) -> Late | None:
        """A report that came at `now` from a router told to report every `interval_s`,
        measured at `measured_at` by the router's clock and covering the `covers_s`
        before (None, 0.0: a router that does not say; then it counts as measured when
        it came, covering the time since the same router's previous report). Returns
        the share of it that belongs to buckets already closed, if any."""
        self._advance(now)
        previous = self._last.get(source)
        self._last[source] = now
        if measured_at is None or covers_s <= 0.0:
            end, covers = now, 0.0 if previous is None else now - previous
        else:
            offset = self._offsets.get(source)
            offset = Offset(now - measured_at, now) if offset is None else offset.update(
                measured_at, now)
            self._offsets[source] = offset
            end, covers = measured_at + offset.delay, covers_s
        covers = min(covers, MAX_COVER_INTERVALS * interval_s)
        if interval_s <= self.tick_s or covers <= 0.0:  # every tick, or its first
            if end >= self._opened:
                self._add(counts, 1.0)
                return None
            return Late(end - max(covers, self.tick_s), end, counts)
        rate = (counts[0] / covers, counts[1] / covers, counts[2] / covers)
        return self._spread(rate, end, end + covers, now)

    def _spread(self, rate: Counts, start: float, end: float, now: float) -> Late | None:
        """`rate` over [start, end): the past in the closed buckets (returned) and the
        open one, the rest from now on."""
        late = None
        if start < self._opened:
            cut = min(end, self._opened)
            late = Late(start, cut, _times(rate, cut - start))
        if now > self._opened:
            self._add(rate, max(0.0, min(end, now) - max(start, self._opened)))
        if end > now:
            for i, per_s in enumerate(rate):
                self._rate[i] += per_s
            heapq.heappush(self._ends, (end, next(self._order), rate))
        return late

    def _add(self, counts: Counts, times: float) -> None:
        for i, count in enumerate(counts):
            self._added[i] += count * times

    def take(self, now: float) -> Counts:
        """What came into the bucket closing at `now`; the next bucket starts empty."""
        counts = self.peek(now)
        self._added = [0.0, 0.0, 0.0]
        self._opened = max(self._opened, now)
        return counts

    def peek(self, now: float) -> Counts:
        """What came into the open bucket up to `now`."""
        self._advance(now)
        added = self._added
        return added[0], added[1], added[2]

    def forget(self, source: int) -> None:
        """The router is gone (its spreads run to their end: those requests came)."""
        self._last.pop(source, None)
        self._offsets.pop(source, None)

    def _advance(self, until: float) -> None:
        ends = self._ends
        while ends and ends[0][0] <= until:
            self._integrate(ends[0][0])
            _, _, rate = heapq.heappop(ends)
            for i, per_s in enumerate(rate):
                self._rate[i] -= per_s
            if not ends:
                self._rate = [0.0, 0.0, 0.0]  # no rounding left over from the sums
        self._integrate(until)

    def _integrate(self, until: float) -> None:
        if until <= self._at:
            return
        if self._ends:  # (then `_at` is the time of a report, never -inf)
            elapsed = until - self._at
            for i, per_s in enumerate(self._rate):
                self._added[i] += per_s * elapsed
        self._at = until


def _times(counts: Counts, factor: float) -> Counts:
    return counts[0] * factor, counts[1] * factor, counts[2] * factor


def amend(samples: MutableSequence[LoadSample], late: Late) -> float:
    """Add `late`'s counts to the closed buckets it overlaps, each its share by time
    (a bucket lasts `duration_s` up to its `t`); returns the arrivals placed. What
    overlaps none (older than the series) is dropped: no decision reads it any more."""
    length = late.end - late.start
    placed = 0.0
    for k in range(len(samples) - 1, -1, -1):
        sample = samples[k]
        if sample.t <= late.start:
            break
        overlap = min(sample.t, late.end) - max(sample.t - sample.duration_s, late.start)
        if overlap <= 0.0:
            continue
        share = _times(late.counts, overlap / length)
        samples[k] = replace(sample, arrivals=sample.arrivals + share[0],
                             completions=sample.completions + share[1],
                             rejections=sample.rejections + share[2])
        placed += share[0]
    return placed
