"""Scenario traffic as a `surge pulse` schedule, plus two spellings that compile to one.

`traffic.schedule` takes what `surge pulse --scenario` takes (a pulse mapping or a list
of steps, see surge.loadtest.schedule), and two more mappings:

    {diurnal: {min_rps: 2000, max_rps: 20000, period_s: 86400, duration_s: 86400,
               trough_s: 0, step_s: 900}}   # a cosine day, as linear pieces of step_s
    {trace: rates.csv, interpolate: linear}  # rows "t_s,rps" (header optional), relative
                                             # to the scenario file; or `step` interpolation

Both become linear `Segment`s, so arrivals, reports and oracles see one kind of schedule.
`max_rate` and `boundaries` are what the engine asks of a schedule besides its own API.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from surge.config.schema import check_keys, number_in
from surge.loadtest.schedule import Schedule, Segment

__all__ = ["TrafficShape", "oracle_replica_seconds", "parse_schedule"]

_DIURNAL_KEYS = {"min_rps", "max_rps", "period_s", "duration_s", "trough_s", "step_s"}


def _diurnal(spec: Any, where: str) -> Schedule:
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a mapping with {sorted(_DIURNAL_KEYS)}")
    check_keys(spec, sorted(_DIURNAL_KEYS), where)
    low = float(number_in(spec, "min_rps", where, ge=0))
    high = float(number_in(spec, "max_rps", where, ge=0))
    period = float(number_in(spec, "period_s", where, 86400.0, gt=0))
    duration = float(number_in(spec, "duration_s", where, period, gt=0))
    trough = float(number_in(spec, "trough_s", where, 0.0, ge=0))
    step = float(number_in(spec, "step_s", where, period / 96, gt=0))

    def rate(t: float) -> float:
        return low + (high - low) * (1 - math.cos(2 * math.pi * (t - trough) / period)) / 2

    edges = [min(i * step, duration) for i in range(math.ceil(duration / step) + 1)]
    return Schedule(tuple(Segment(b - a, rate(a), rate(b))
                          for a, b in itertools.pairwise(edges) if b > a))


def _trace(spec: Mapping[str, Any], where: str, base: Path | None) -> Schedule:
    unknown = set(spec) - {"trace", "interpolate"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; a trace takes trace "
                         "(a CSV path) and interpolate (linear or step)")
    interpolate = spec.get("interpolate", "linear")
    if interpolate not in ("linear", "step"):
        raise ValueError(f"{where}.interpolate must be linear or step, got {interpolate!r}")
    path = Path(str(spec["trace"]))
    if base is not None and not path.is_absolute():
        path = base / path
    try:
        rows = list(csv.reader(path.read_text().splitlines()))
    except OSError as exc:
        raise ValueError(f"{where}.trace: cannot read {path}: {exc.strerror}") from None
    points: list[tuple[float, float]] = []
    for number, row in enumerate(rows, 1):
        if not row or row[0].lstrip().startswith("#"):
            continue
        try:
            t, rps = float(row[0]), float(row[1])
        except (ValueError, IndexError):
            if not points and number == 1:
                continue  # a header
            raise ValueError(f"{path}:{number}: expected 't_s,rps', got {','.join(row)!r}") \
                from None
        if points and t <= points[-1][0]:
            raise ValueError(f"{path}:{number}: times must increase ({t:g} after "
                             f"{points[-1][0]:g})")
        if rps < 0 or not math.isfinite(rps) or t < 0:
            raise ValueError(f"{path}:{number}: t_s and rps must be finite and >= 0")
        points.append((t, rps))
    if len(points) < 2:
        raise ValueError(f"{path}: a trace needs at least two rows (the last one ends it)")
    segments = []
    if points[0][0] > 0:
        segments.append(Segment(points[0][0], 0.0, 0.0))
    for (t0, r0), (t1, r1) in itertools.pairwise(points):
        segments.append(Segment(t1 - t0, r0, r1 if interpolate == "linear" else r0))
    return Schedule(tuple(segments))


def parse_schedule(spec: Any, where: str, base: Path | None = None) -> Schedule:
    """`surge pulse`'s schedule spec, or {diurnal: ...}, or {trace: FILE}."""
    try:
        if isinstance(spec, Mapping) and "diurnal" in spec:
            if set(spec) != {"diurnal"}:
                raise ValueError(f"{where}: diurnal goes alone, got {sorted(spec)}")
            return _diurnal(spec["diurnal"], f"{where}.diurnal")
        if isinstance(spec, Mapping) and "trace" in spec:
            return _trace(spec, where, base)
        return Schedule.from_spec(spec)
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith((where, "/", str(base or "//")))
                         else f"{where}: {message}") from None


class TrafficShape:
    """A schedule's breakpoints, for the largest rate over an interval."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        starts = [0.0]
        for segment in schedule.segments:
            starts.append(starts[-1] + segment.duration_s)
        self.starts = starts

    def max_rate(self, t0: float, t1: float) -> float:
        """The highest rate in [t0, t1) (rates are linear between breakpoints)."""
        rate, segments = self.schedule.rate_at, self.schedule.segments
        best = max(rate(t0), rate(max(t0, t1 - 1e-9)))
        index = bisect.bisect_right(self.starts, t0)
        while index < len(segments) and self.starts[index] < t1:
            best = max(best, segments[index - 1].end_rps, segments[index].start_rps)
            index += 1
        return best


def _ceil_seconds(r0: float, r1: float, duration: float, per_replica: float) -> float:
    """Integral over a linear segment of ceil(rate / per_replica), exactly."""
    if duration <= 0:
        return 0.0
    if r0 == r1:
        return duration * math.ceil(r0 / per_replica - 1e-12)
    low, high = min(r0, r1), max(r0, r1)
    total = 0.0
    for level in range(max(1, math.ceil(low / per_replica - 1e-12)),
                       math.ceil(high / per_replica - 1e-12) + 1):
        # the share of the ramp with rate in ((level - 1) c, level c]
        share = min(high, level * per_replica) - max(low, (level - 1) * per_replica)
        if share > 0:
            total += level * duration * share / (high - low)
    return total


def oracle_replica_seconds(schedule: Schedule, per_replica_rps: float,
                           until_s: float | None = None) -> float:
    """The oracle's cost: ceil(rate / capacity) replicas at every instant, no start-up."""
    total, start = 0.0, 0.0
    end = schedule.duration_s if until_s is None else until_s
    for segment in schedule.segments:
        if start >= end:
            break
        duration = min(segment.duration_s, end - start)
        r1 = segment.start_rps + (segment.end_rps - segment.start_rps) * (
            duration / segment.duration_s if segment.duration_s else 1.0)
        total += _ceil_seconds(segment.start_rps, r1, duration, per_replica_rps)
        start += segment.duration_s
    return total
