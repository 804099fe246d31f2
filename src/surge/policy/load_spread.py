"""Router load reports spread over the time they cover, for one deployment's buckets.

A router reports its counters (arrivals, completions, rejections) since its previous
report every load interval (policy/cadence.load_report_interval_s: every tick up to 200
routers, 0.5 s at 1,000). Landed whole in the tick's bucket where they arrive, reports
every 0.5 s from routers whose timers started together make the bucket series a comb
(every fifth bucket holds all of them, and which one drifts as the ticks and the
routers' timers slip against each other), and the rate's slope over 1 s reads a smooth
ramp as a surge: at 10,000 replicas x 1,000 routers, ~1M req/s per s where the ramp rose
by 20,000 (bench/control_scale.py), which the proactive policy projects over its
start-up lead. `ReportSpread` spreads each report over the interval it covers, from its
arrival on: the time since the same router's previous report, at most
`MAX_COVER_INTERVALS` told intervals (a router quiet for a while reports what came in
its last interval). A steady router then adds a constant rate, however the timers line
up. Reports while routers report every tick, and a router's first, land whole in the
bucket, as before; so the signal of a step is delayed by at most one report interval,
and only where routers report less often than every tick.
"""

from __future__ import annotations

import heapq
import itertools

__all__ = ["MAX_COVER_INTERVALS", "Counts", "ReportSpread"]

Counts = tuple[float, float, float]  # arrivals, completions, rejections

# A report covers at most this many told intervals: a late timer's report is still
# spread whole, a router back from idle does not dilute its first report.
MAX_COVER_INTERVALS = 2.0


class ReportSpread:
    """Counters of one deployment's reports, integrated over the time each covers."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self._last: dict[int, float] = {}  # source -> when its previous report came
        self._added = [0.0, 0.0, 0.0]  # in the open bucket so far
        self._rate = [0.0, 0.0, 0.0]  # per second, of the spreads running at `_at`
        self._ends: list[tuple[float, int, Counts]] = []  # (end, order, rate): a heap
        self._order = itertools.count()
        self._at = -float("inf")  # integrated up to here

    def __repr__(self) -> str:
        return (f"<ReportSpread sources={len(self._last)} spreading={len(self._ends)} "
                f"rate={self._rate[0]:.1f}/s>")

    def add(self, source: int, counts: Counts, now: float, interval_s: float) -> None:
        """A report that came at `now` from a router told to report every `interval_s`."""
        self._advance(now)
        previous = self._last.get(source)
        self._last[source] = now
        covers = 0.0 if previous is None else min(now - previous,
                                                  MAX_COVER_INTERVALS * interval_s)
        if interval_s <= self.tick_s or covers <= 0.0:  # every tick, or its first
            for i, count in enumerate(counts):
                self._added[i] += count
            return
        rate = (counts[0] / covers, counts[1] / covers, counts[2] / covers)
        for i, per_s in enumerate(rate):
            self._rate[i] += per_s
        heapq.heappush(self._ends, (now + covers, next(self._order), rate))

    def take(self, now: float) -> Counts:
        """What came into the bucket closing at `now`; the next bucket starts empty."""
        counts = self.peek(now)
        self._added = [0.0, 0.0, 0.0]
        return counts

    def peek(self, now: float) -> Counts:
        """What came into the open bucket up to `now`."""
        self._advance(now)
        added = self._added
        return added[0], added[1], added[2]

    def forget(self, source: int) -> None:
        """The router is gone (its spreads run to their end: those requests came)."""
        self._last.pop(source, None)

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
