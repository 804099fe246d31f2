"""Quantiles of an interval from cumulative histogram buckets, as PromQL computes them.

The controller holds each histogram series cumulatively (counts per bucket since the
series began, the last bucket +Inf). What happened in one interval is the difference
of two readings, bucket by bucket (`bucket_delta`); the quantile of that difference is
`histogram_quantile`'s: find the bucket the rank falls in and interpolate linearly
between its bounds (the first bucket's lower bound is 0; a rank in +Inf answers the
highest finite bound). A series that went backwards (its replica started over under
the same labels) counts from zero rather than going negative. Pure functions on
numbers: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["add_counts", "bucket_delta", "bucket_quantile"]


def bucket_delta(previous: Sequence[int] | None, current: Sequence[int]) -> list[int]:
    """What `current` counted since `previous` (None: since the series began)."""
    if previous is None or len(previous) != len(current):
        return list(current)
    if any(now < before for before, now in zip(previous, current, strict=True)):
        return list(current)  # reset: everything it holds is new
    return [now - before for before, now in zip(previous, current, strict=True)]


def add_counts(into: list[int], counts: Sequence[int]) -> list[int]:
    """`into` plus `counts`, bucket by bucket (an empty `into` takes a copy)."""
    if not into:
        return list(counts)
    return [a + b for a, b in zip(into, counts, strict=True)]


def bucket_quantile(boundaries: Sequence[float], counts: Sequence[int],
                    q: float) -> float | None:
    """The q-quantile (0..1) of `counts` (len(boundaries) + 1 buckets, +Inf last);
    None when nothing was counted."""
    total = sum(counts)
    if total == 0:
        return None
    rank, seen, lower = q * total, 0, 0.0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index >= len(boundaries):
                break  # in +Inf
            upper = boundaries[index]
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
        if index < len(boundaries):
            lower = boundaries[index]
    return boundaries[-1] if boundaries else None
