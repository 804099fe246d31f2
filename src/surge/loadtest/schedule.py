"""Rate schedules and the arrival times they imply (pure: no clock, no global random).

A schedule is a sequence of segments, each with a duration and a rate that moves
linearly from `start_rps` to `end_rps`; the classic pulse is baseline -> ramp -> peak
(hold) -> ramp down -> baseline. `expected(t)` is the integral of the rate (the
expected number of requests sent by time t) and `time_of(n)` its inverse.

Arrival times come out per window [a, b) so a run of any length needs bounded memory:

* uniform: request k (k = 0, 1, ...) is sent at `time_of(k)`, so any window holds
  exactly ceil(expected(b)) - ceil(expected(a)) requests (ceil ignoring float dust).
* poisson: a non-homogeneous Poisson process (given the count in a window, arrivals are
  uniform in expected-count space, then mapped through `time_of`), drawn from an `rng`
  the caller passes in.

A run split over `workers` processes gives worker w the uniform requests k = w mod
workers, or a Poisson process of 1/workers of the rate (their sum is the full process).

The same spec (a pulse mapping or a list of steps, see `from_spec`) describes traffic
for `surge pulse --scenario` and `surge simulate` scenarios.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from surge.config import schema

__all__ = [
    "ARRIVALS",
    "Schedule",
    "Segment",
    "arrival_times",
    "pulse",
]

ARRIVALS = ("uniform", "poisson")
# Expected counts are sums of float products; below this they are rounding, not requests.
_DUST = 1e-7

FloatArray = npt.NDArray[np.float64]

_PULSE_KEYS = ("baseline_rps", "peak_rps", "baseline_s", "ramp_s", "hold_s", "ramp_down_s",
               "after_s")


@dataclass(frozen=True)
class Segment:
    """`duration_s` seconds during which the rate moves linearly from start to end."""

    duration_s: float
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        for name in ("duration_s", "start_rps", "end_rps"):
            object.__setattr__(self, name, float(schema.number(name, getattr(self, name), ge=0)))

    @property
    def expected(self) -> float:
        return (self.start_rps + self.end_rps) / 2 * self.duration_s


@dataclass(frozen=True)
class Schedule:
    segments: tuple[Segment, ...]
    # segment start times and expected counts at those starts, one extra at the end
    _starts: FloatArray = field(init=False, repr=False, compare=False)
    _counts: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))
        if not self.segments:
            raise ValueError("a schedule needs at least one segment")
        starts = [0.0]
        counts = [0.0]
        for segment in self.segments:
            starts.append(starts[-1] + segment.duration_s)
            counts.append(counts[-1] + segment.expected)
        object.__setattr__(self, "_starts", np.array(starts))
        object.__setattr__(self, "_counts", np.array(counts))

    def __repr__(self) -> str:
        steps = ", ".join(f"{s.start_rps:g}->{s.end_rps:g}/s for {s.duration_s:g}s"
                          for s in self.segments)
        return f"<Schedule {self.duration_s:g}s {self.total:.0f} requests: {steps}>"

    @property
    def duration_s(self) -> float:
        return float(self._starts[-1])

    @property
    def total(self) -> float:
        """Expected requests over the whole schedule."""
        return float(self._counts[-1])

    @property
    def peak_rps(self) -> float:
        return max(max(s.start_rps, s.end_rps) for s in self.segments)

    def _locate(self, t: float) -> tuple[int, float]:
        starts = self._starts
        index = int(np.searchsorted(starts, t, side="right")) - 1
        index = min(max(index, 0), len(self.segments) - 1)
        return index, t - float(starts[index])

    def rate_at(self, t: float) -> float:
        if t < 0 or t >= self.duration_s:
            return 0.0
        index, dt = self._locate(t)
        segment = self.segments[index]
        if segment.duration_s == 0:
            return segment.end_rps
        return segment.start_rps + (segment.end_rps - segment.start_rps) * dt / segment.duration_s

    def expected(self, t: float) -> float:
        """Expected requests sent in [0, t)."""
        if t <= 0:
            return 0.0
        if t >= self.duration_s:
            return self.total
        index, dt = self._locate(t)
        segment = self.segments[index]
        counts = self._counts
        slope = (segment.end_rps - segment.start_rps) / segment.duration_s
        return float(counts[index]) + segment.start_rps * dt + slope * dt * dt / 2

    def time_of(self, counts: FloatArray) -> FloatArray:
        """Inverse of `expected`: the time at which each expected count is reached."""
        starts, cumulative = self._starts, self._counts
        counts = np.asarray(counts, dtype=np.float64)
        index = np.searchsorted(cumulative, counts, side="right") - 1
        index = np.clip(index, 0, len(self.segments) - 1)
        r0 = np.array([s.start_rps for s in self.segments], dtype=np.float64)[index]
        r1 = np.array([s.end_rps for s in self.segments], dtype=np.float64)[index]
        duration = np.array([s.duration_s for s in self.segments], dtype=np.float64)[index]
        x = counts - cumulative[index]
        half_slope = np.divide(r1 - r0, 2 * duration, out=np.zeros_like(r0),
                               where=duration > 0)
        # a*dt^2 + r0*dt = x, written so that a -> 0 and r0 = 0 stay exact and stable
        root = np.sqrt(np.maximum(r0 * r0 + 4 * half_slope * x, 0.0))
        denominator = r0 + root
        dt = np.divide(2 * x, denominator, out=np.zeros_like(x), where=denominator > 0)
        # A count inside a segment is reached within it; this also absorbs underflow at
        # subnormal rates (r0 * r0 == 0 while r0 > 0).
        dt = np.clip(dt, 0.0, duration)
        times: FloatArray = starts[index] + dt
        return times

    def pulse_window(self) -> tuple[float, float] | None:
        """[start, end) of the time the rate is above its starting rate, if ever."""
        base = self.segments[0].start_rps
        start: float | None = None
        end = 0.0
        t = 0.0
        for segment in self.segments:
            above = max(segment.start_rps, segment.end_rps) > base
            if above:
                if start is None:
                    start = t
                end = t + segment.duration_s
            t += segment.duration_s
        return None if start is None else (start, end)

    def to_spec(self) -> list[dict[str, float]]:
        return [{"for_s": s.duration_s, "from_rps": s.start_rps, "to_rps": s.end_rps}
                for s in self.segments]

    @classmethod
    def from_spec(cls, spec: Any) -> Schedule:
        """A pulse mapping (`baseline_rps`, `peak_rps`, `ramp_s`, ...) or a list of steps.

        Steps: `{rps: R, for_s: S}` (constant), `{to_rps: R, over_s: S}` (linear from
        the previous rate), `{from_rps: A, to_rps: B, for_s: S}` (explicit).
        """
        if isinstance(spec, Mapping):
            schema.check_keys(spec, _PULSE_KEYS, "pulse")
            for key in ("baseline_rps", "peak_rps"):
                if key not in spec:
                    raise ValueError(f"a pulse needs {key}")
            return pulse(**{key: float(value) for key, value in spec.items()})
        if isinstance(spec, Sequence) and not isinstance(spec, str):
            return cls(tuple(_steps(spec)))
        raise ValueError("a schedule is a pulse mapping (baseline_rps, peak_rps, ...) or a "
                         "list of steps like {rps: 100, for_s: 5}")


def _steps(steps: Sequence[Any]) -> list[Segment]:
    segments: list[Segment] = []
    previous = 0.0
    for number, step in enumerate(steps, 1):
        if not isinstance(step, Mapping):
            raise ValueError(f"step {number}: expected a mapping, got {step!r}")
        keys = set(step)
        if keys == {"rps", "for_s"}:
            segment = Segment(float(step["for_s"]), float(step["rps"]), float(step["rps"]))
        elif keys == {"to_rps", "over_s"}:
            segment = Segment(float(step["over_s"]), previous, float(step["to_rps"]))
        elif keys == {"from_rps", "to_rps", "for_s"}:
            segment = Segment(float(step["for_s"]), float(step["from_rps"]),
                              float(step["to_rps"]))
        else:
            raise ValueError(f"step {number}: {sorted(keys)} is none of {{rps, for_s}}, "
                             "{to_rps, over_s}, {from_rps, to_rps, for_s}")
        segments.append(segment)
        previous = segment.end_rps
    return segments


def pulse(baseline_rps: float, peak_rps: float, baseline_s: float = 5.0, ramp_s: float = 0.5,
          hold_s: float = 20.0, ramp_down_s: float | None = None,
          after_s: float | None = None) -> Schedule:
    """Baseline for `baseline_s` -> ramp over `ramp_s` -> peak for `hold_s` -> back.

    The way back ramps over `ramp_down_s` (default: `ramp_s`) and stays at the baseline
    for `after_s` (default: `baseline_s`). Zero-length parts are left out.
    """
    down = ramp_s if ramp_down_s is None else ramp_down_s
    after = baseline_s if after_s is None else after_s
    parts = [Segment(baseline_s, baseline_rps, baseline_rps),
             Segment(ramp_s, baseline_rps, peak_rps),
             Segment(hold_s, peak_rps, peak_rps),
             Segment(down, peak_rps, baseline_rps),
             Segment(after, baseline_rps, baseline_rps)]
    kept = tuple(p for p in parts if p.duration_s > 0)
    if not kept:
        raise ValueError("the pulse lasts 0 s: give baseline_s, ramp_s or hold_s")
    return Schedule(kept)


def _ceil(count: float) -> int:
    """ceil() that does not count float dust (129.00000000000004 is 129)."""
    return math.ceil(count - _DUST)


def arrival_times(schedule: Schedule, start: float, end: float, *, arrivals: str = "uniform",
                  rng: np.random.Generator | None = None, worker: int = 0,
                  workers: int = 1) -> FloatArray:
    """Sorted send times in [start, end) for `worker` of `workers` (seconds from t=0)."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}, got {arrivals!r}")
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} out of range for {workers} workers")
    low, high = schedule.expected(start), schedule.expected(min(end, schedule.duration_s))
    if high <= low:
        return np.empty(0)
    if arrivals == "uniform":
        first = _ceil(low)
        first += (worker - first) % workers
        ks = np.arange(first, _ceil(high), workers, dtype=np.float64)
        return schedule.time_of(ks)
    if rng is None:
        raise ValueError("poisson arrivals need an rng (numpy.random.Generator)")
    count = int(rng.poisson((high - low) / workers))
    points = np.sort(rng.uniform(low, high, count))
    times: FloatArray = schedule.time_of(points)
    # rounding in time_of must not move a time out of its window
    return np.clip(times, start, np.nextafter(end, -math.inf))
