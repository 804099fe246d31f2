"""What a pulse run saw, per 100 ms point (pure); loadtest/summary.py reads it.

A `Record` is filled by the generator with explicit times (seconds from the start of
the schedule), so tests drive it on a fake clock and assert exact counts:

* `offered` and send lag are counted at the point of the *scheduled* send time;
* `ok` (2xx) and errors at the point the response (or the timeout) *completed*, which
  is what "served per second" means; errors are also kept by scheduled point;
* latencies (2xx only, from the scheduled send time) in a histogram per scheduled
  point: integer microseconds keeping 11 significant bits (< 0.1 % error), so records
  from several worker processes merge by adding counts.

Streamed LLM responses (`--preset chat`) add, for 2xx: time to first token and time
per output token histograms by scheduled point, the run's inter-token gaps and
end-to-end latencies, the streams that met the goodput objectives (loadtest/slo.py),
output tokens per request, and output tokens spread evenly over the points between a
stream's first token and its end (tokens/s over time).

Every request ends in exactly one of ok, an error class ("503", any other status,
"timeout", "connection", "overflow") or unanswered, so `sent == ok + sum(errors) +
unanswered` holds by construction and `Record.check()` verifies it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from surge.loadtest.slo import Slo

__all__ = [
    "BUCKET_S",
    "ERROR_CLASSES",
    "POINTS_PER_S",
    "Record",
    "ReplicaSample",
    "Window",
    "interpolated_percentile",
    "latency_key",
    "mean_std",
    "merge_histograms",
    "percentile",
    "point_of",
    "replica_points",
]

BUCKET_S = 0.1
POINTS_PER_S = 10
# Always present in summary["errors"], so a reader never wonders whether 0 means absent.
ERROR_CLASSES = ("503", "timeout", "connection")
# A point counts as "behind" when a request in it was handed to a connection this late:
# uvloop timers tick in milliseconds, so a few ms is the floor, 10 ms is a real stall.
BEHIND_S = 0.010
# A replica sample older than this no longer describes a point.
REPLICA_STALE_S = 0.5
# Keep this many significant bits of a latency in microseconds (relative error < 0.1 %).
_SIGNIFICANT_BITS = 11
_EXACT_BELOW_US = 1 << _SIGNIFICANT_BITS
# Send lag is kept at 0.1 ms resolution (keys in microseconds, like latencies).
_LAG_KEY_US = 100
_LAG_KEYS_PER_S = 1_000_000 // _LAG_KEY_US
_EPS = 1e-9

Histogram = dict[int, int]


def point_of(t: float) -> int:
    """The 100 ms point holding time t (a hair of tolerance for float rounding)."""
    return max(int(t * POINTS_PER_S + _EPS), 0)


def latency_key(seconds: float) -> int:
    """Microseconds, truncated to 11 significant bits (exact below 2.048 ms)."""
    us = int(seconds * 1_000_000)
    if us <= 0:
        return 0
    shift = us.bit_length() - _SIGNIFICANT_BITS
    return us if shift <= 0 else (us >> shift) << shift


def merge_histograms(histograms: Iterable[Mapping[int, int]]) -> Histogram:
    merged: Histogram = {}
    for histogram in histograms:
        for key, count in histogram.items():
            merged[key] = merged.get(key, 0) + count
    return merged


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]) in milliseconds; None when empty."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total - _EPS))
    seen = 0
    for key in sorted(histogram):
        seen += histogram[key]
        if seen >= rank:
            return key / 1000.0
    raise AssertionError("unreachable: rank <= total")  # pragma: no cover


def interpolated_percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """numpy.percentile's default (linear) of the kept values (q in [0, 1]), ms, as
    `vllm bench serve` reports: the value at 0-based rank q * (n - 1), between its two
    neighbours. A key is a value within 0.1 %, so this is numpy's answer of the exact
    values within 0.1 %. None when empty."""
    total = sum(histogram.values())
    if total == 0:
        return None
    position = q * (total - 1)
    lower = math.floor(position)
    ranks = (lower, min(lower + 1, total - 1))
    found: list[int] = []
    seen = 0
    for key in sorted(histogram):
        seen += histogram[key]
        while len(found) < 2 and seen > ranks[len(found)]:
            found.append(key)
        if len(found) == 2:
            break
    low, high = found
    return (low + (position - lower) * (high - low)) / 1000.0


def mean_std(histogram: Mapping[int, int]) -> tuple[float | None, float | None]:
    """Mean and population standard deviation in milliseconds (None when empty), of the
    kept values: within 0.1 % of the exact ones."""
    total = sum(histogram.values())
    if total == 0:
        return None, None
    mean = sum(key * n for key, n in histogram.items()) / total
    variance = sum(n * (key - mean) ** 2 for key, n in histogram.items()) / total
    return mean / 1000.0, math.sqrt(variance) / 1000.0


def _add(counts: list[int], point: int, n: int = 1) -> None:
    if point >= len(counts):
        counts.extend([0] * (point + 1 - len(counts)))
    counts[point] += n


def _add_latency(histograms: list[Histogram], point: int, seconds: float) -> None:
    if point >= len(histograms):
        histograms.extend({} for _ in range(point + 1 - len(histograms)))
    key = latency_key(seconds)
    histograms[point][key] = histograms[point].get(key, 0) + 1


@dataclass(frozen=True)
class Window:
    """Counts over a few points, for the live progress line."""

    seconds: float
    offered: int
    ok: int
    errors: int
    latency: Histogram

    @property
    def p99_ms(self) -> float | None:
        return percentile(self.latency, 0.99)


class Record:
    """Per-point counts of one run (or the merge of several workers' runs)."""

    def __init__(self, slo: Slo | None = None) -> None:
        self.offered: list[int] = []
        self.ok: list[int] = []
        self.errors: dict[str, list[int]] = {}  # by completion point
        self.errors_sent: dict[str, list[int]] = {}  # by scheduled point
        self.latency: list[Histogram] = []  # 2xx, by scheduled point
        self.latency_done: list[Histogram] = []  # 2xx, by completion point (live line)
        # 503/429 answers (overload refused), by scheduled point: how fast a refusal came
        self.refused: list[Histogram] = []
        self.lag_max: list[float] = []  # seconds, by scheduled point
        self.lag: Histogram = {}
        self.unanswered = 0
        self.waited = 0  # requests that found every allowed connection busy
        self.connections_opened = 0
        self.connections_peak = 0
        # Streams (LLM presets): TTFT and TPOT by scheduled point, tokens over time; the
        # run's inter-token gaps (ITL) and end-to-end latencies; streams that met `slo`.
        self.ttft: list[Histogram] = []
        self.tpot: list[Histogram] = []
        self.itl: Histogram = {}
        self.e2el: Histogram = {}
        self.tokens: list[float] = []
        self.tokens_per_request: Histogram = {}
        self.slo = slo
        self.good = 0

    def __repr__(self) -> str:
        return (f"<Record points={self.points} sent={self.sent} ok={self.total_ok} "
                f"errors={self.error_totals()} unanswered={self.unanswered}>")

    # -- filling (the generator's hot path: kept flat, no helper calls) ----------------

    def reserve(self, points: int) -> None:
        """Allocate `points` points up front so the hot path never grows a list."""
        for counts in (self.offered, self.ok):
            counts.extend([0] * (points - len(counts)))
        for histograms in (self.latency, self.latency_done):
            histograms.extend({} for _ in range(points - len(histograms)))
        self.lag_max.extend([0.0] * (points - len(self.lag_max)))

    def sent_at(self, point: int, lag_s: float) -> None:
        try:
            self.offered[point] += 1
            if lag_s > self.lag_max[point]:
                self.lag_max[point] = lag_s
        except IndexError:
            self.reserve(point + 1)
            self.offered[point] += 1
            self.lag_max[point] = max(self.lag_max[point], lag_s)
        key = int(lag_s * _LAG_KEYS_PER_S) * _LAG_KEY_US  # 0.1 ms resolution is plenty
        self.lag[key] = self.lag.get(key, 0) + 1

    def ok_at(self, sent_point: int, done_point: int, latency_s: float) -> None:
        try:
            self.ok[done_point] += 1
            histogram = self.latency[sent_point]
            done = self.latency_done[done_point]
        except IndexError:
            self.reserve(max(sent_point, done_point) + 1)
            self.ok[done_point] += 1
            histogram = self.latency[sent_point]
            done = self.latency_done[done_point]
        us = int(latency_s * 1_000_000)  # latency_key(), inlined
        if us >= _EXACT_BELOW_US:
            shift = us.bit_length() - _SIGNIFICANT_BITS
            us = (us >> shift) << shift
        histogram[us] = histogram.get(us, 0) + 1
        done[us] = done.get(us, 0) + 1

    def stream_at(self, sent_point: int, first_s: float, done_s: float, ttft_s: float,
                  tpot_s: float | None, tokens: int, gaps: Sequence[float] = (),
                  e2el_s: float | None = None) -> None:
        """A 2xx stream's measures (after `ok_at`); times in seconds of the schedule."""
        _add_latency(self.ttft, sent_point, ttft_s)
        if tpot_s is not None:
            _add_latency(self.tpot, sent_point, tpot_s)
        itl = self.itl
        for gap in gaps:
            key = latency_key(gap)
            itl[key] = itl.get(key, 0) + 1
        if e2el_s is not None:
            key = latency_key(e2el_s)
            self.e2el[key] = self.e2el.get(key, 0) + 1
        if self.slo is not None and self.slo.met(ttft_s, tpot_s or 0.0, e2el_s or 0.0):
            self.good += 1
        self.tokens_per_request[tokens] = self.tokens_per_request.get(tokens, 0) + 1
        first, last = point_of(first_s), point_of(done_s)
        if last >= len(self.tokens):
            self.tokens.extend([0.0] * (last + 1 - len(self.tokens)))
        share = tokens / (last - first + 1)
        for point in range(first, last + 1):
            self.tokens[point] += share

    def error_at(self, kind: str, sent_point: int, done_point: int) -> None:
        _add(self.errors.setdefault(kind, []), done_point)
        _add(self.errors_sent.setdefault(kind, []), sent_point)

    def refused_at(self, sent_point: int, latency_s: float) -> None:
        """A 503 or 429 answer's latency (after `error_at`)."""
        _add_latency(self.refused, sent_point, latency_s)

    # -- reading --------------------------------------------------------------------------

    @property
    def points(self) -> int:
        """Points up to the last one anything happened in (reserved empty ones excluded)."""
        last = -1
        for counts in (self.offered, self.ok, *self.errors.values(),
                       *self.errors_sent.values()):
            for point in range(len(counts) - 1, last, -1):
                if counts[point]:
                    last = point
                    break
        return last + 1

    @property
    def sent(self) -> int:
        return sum(self.offered)

    @property
    def total_ok(self) -> int:
        return sum(self.ok)

    def error_totals(self) -> dict[str, int]:
        totals = {kind: 0 for kind in ERROR_CLASSES}
        for kind, counts in self.errors.items():
            totals[kind] = totals.get(kind, 0) + sum(counts)
        return totals

    def check(self) -> None:
        """Every request sent ended exactly once; raise if the books do not balance."""
        answered = self.total_ok + sum(self.error_totals().values()) + self.unanswered
        if answered != self.sent:
            raise AssertionError(f"accounting: sent {self.sent} != ok {self.total_ok} + "
                                 f"errors {self.error_totals()} + unanswered "
                                 f"{self.unanswered}")

    def window(self, first: int, last: int) -> Window:
        """Points [first, last): offered by scheduled time, answers (and their latency)
        by completion time, so a slow answer shows when it arrives."""
        span = range(max(first, 0), last)

        def total(counts: Sequence[int]) -> int:
            return sum(counts[i] for i in span if i < len(counts))

        return Window(
            seconds=len(span) * BUCKET_S, offered=total(self.offered), ok=total(self.ok),
            errors=sum(total(counts) for counts in self.errors.values()),
            latency=merge_histograms(self.latency_done[i] for i in span
                                     if i < len(self.latency_done)))

    def merge(self, other: Record) -> None:
        for counts, more in ((self.offered, other.offered), (self.ok, other.ok)):
            for point, n in enumerate(more):
                if n:
                    _add(counts, point, n)
        for mine, theirs in ((self.errors, other.errors),
                             (self.errors_sent, other.errors_sent)):
            for kind, more in theirs.items():
                counts = mine.setdefault(kind, [])
                for point, n in enumerate(more):
                    _add(counts, point, n)
        for mine_h, theirs_h in ((self.latency, other.latency),
                                 (self.latency_done, other.latency_done),
                                 (self.refused, other.refused)):
            for point, histogram in enumerate(theirs_h):
                if point >= len(mine_h):
                    mine_h.extend({} for _ in range(point + 1 - len(mine_h)))
                if histogram:
                    mine_h[point] = merge_histograms([mine_h[point], histogram])
        for point, lag in enumerate(other.lag_max):
            if point >= len(self.lag_max):
                self.lag_max.extend([0.0] * (point + 1 - len(self.lag_max)))
            self.lag_max[point] = max(self.lag_max[point], lag)
        self.lag = merge_histograms([self.lag, other.lag])
        self.itl = merge_histograms([self.itl, other.itl])
        self.e2el = merge_histograms([self.e2el, other.e2el])
        self.good += other.good
        self.slo = self.slo or other.slo
        for mine_s, theirs_s in ((self.ttft, other.ttft), (self.tpot, other.tpot)):
            for point, histogram in enumerate(theirs_s):
                if point >= len(mine_s):
                    mine_s.extend({} for _ in range(point + 1 - len(mine_s)))
                mine_s[point] = merge_histograms([mine_s[point], histogram])
        for point, amount in enumerate(other.tokens):
            if point >= len(self.tokens):
                self.tokens.extend([0.0] * (point + 1 - len(self.tokens)))
            self.tokens[point] += amount
        self.tokens_per_request = merge_histograms([self.tokens_per_request,
                                                    other.tokens_per_request])
        self.unanswered += other.unanswered
        self.waited += other.waited
        self.connections_opened += other.connections_opened
        self.connections_peak += other.connections_peak  # workers hold theirs at once


# -- replica counts -----------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ReplicaSample:
    t: float  # seconds from the start of the schedule
    running: int
    target: int
    # Busy share (0-1) of all the cores of the replicas' node, as its controller read
    # it; None where not known (another node, an older surge).
    node_cpu: float | None = field(default=None, compare=False)


def replica_points(samples: Sequence[ReplicaSample],
                   points: int) -> list[ReplicaSample | None]:
    """For each point, the latest sample taken before its end, unless it is stale."""
    ordered = sorted(samples)
    found: list[ReplicaSample | None] = []
    index = -1
    for point in range(points):
        end = (point + 1) / POINTS_PER_S
        while index + 1 < len(ordered) and ordered[index + 1].t < end - _EPS:
            index += 1
        latest = ordered[index] if index >= 0 else None
        fresh = latest is not None and end - latest.t <= REPLICA_STALE_S + _EPS
        found.append(latest if fresh else None)
    return found
