"""The load signals the autoscaling policies read from a deployment's 0.1 s series.

A `LoadSample` is one bucket of what a deployment's routers and replicas saw; the
controller and the simulator keep the recent ones, oldest first. From them:
`arrival_rate` (offered requests/s over a window, rejected ones included),
`arrival_slope` (its least-squares slope, per bucket or, for an LLM deployment's open
bucket, weighted by length) and `service_time_s` (Little's law: mean ongoing over the
completion rate). A window holds the buckets that end inside it. Pure: samples and
`now` in, a number out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LoadSample", "arrival_rate", "arrival_slope", "service_time_s"]

# Slack when comparing a bucket's end with a window's start (float sums of 0.1 s).
_EPS_S = 1e-6


@dataclass(frozen=True)
class LoadSample:
    """One bucket (~0.1 s) of a deployment's load, summed over its routers and replicas."""

    t: float  # end of the bucket
    arrivals: float  # requests offered in the bucket, rejected ones included
    completions: float
    rejections: float
    queued: float  # waiting in routers at the end of the bucket
    ongoing: float  # running on replicas at the end of the bucket
    duration_s: float = 0.1


def _window(samples: Sequence[LoadSample], now: float, seconds: float) -> list[LoadSample]:
    # A bucket ending at now - seconds lies wholly before the window.
    return [s for s in samples if s.t > now - seconds + _EPS_S]


def arrival_rate(samples: Sequence[LoadSample], now: float, seconds: float) -> float:
    recent = _window(samples, now, seconds)
    span = sum(s.duration_s for s in recent)
    return sum(s.arrivals for s in recent) / span if span > 0 else 0.0


def arrival_slope(samples: Sequence[LoadSample], now: float, seconds: float,
                  weighted: bool = False) -> float:
    """Least-squares slope of the per-bucket arrival rate, in requests/s per second.

    `weighted`: each bucket at its middle and weighted by its length, for an LLM
    deployment, whose decisions between ticks come on a jump in its arrivals (policy/
    arrival_jump.py) with an open bucket holding a request or two. Unweighted, one
    request 10 ms into it read as 100 req/s, and after 1 req/s as a slope of +45/s (3
    replicas, where a tick's bucket holding the same request asked for none); weighted
    it counts as the requests it holds. (Buckets of one length give the same slope
    either way. A router's queue that starts to grow, the other urgent report, is
    decided on unweighted: the short bucket's steep slope is what acts on it.)"""
    recent = _window(samples, now, seconds)
    if len(recent) < 3:
        return 0.0
    if weighted:
        return _weighted_slope(recent)
    xs = [s.t for s in recent]
    ys = [s.arrivals / s.duration_s for s in recent]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var


def _weighted_slope(recent: Sequence[LoadSample]) -> float:
    weights = [s.duration_s for s in recent]
    total = sum(weights)
    if total <= 0:
        return 0.0
    xs = [s.t - s.duration_s / 2 for s in recent]
    mean_x = sum(w * x for w, x in zip(weights, xs, strict=True)) / total
    mean_rate = sum(s.arrivals for s in recent) / total
    var = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs, strict=True))
    if var <= 1e-12 * total:
        return 0.0
    # the sum of w (x - mean_x) (arrivals / w - mean_rate), without dividing by w
    return sum((x - mean_x) * (s.arrivals - w * mean_rate)
               for w, x, s in zip(weights, xs, recent, strict=True)) / var


def service_time_s(samples: Sequence[LoadSample], now: float, default: float,
                   seconds: float = 1.0) -> float:
    """Little's law over the last `seconds`: W = mean ongoing / completion rate."""
    recent = _window(samples, now, seconds)
    span = sum(s.duration_s for s in recent)
    done = sum(s.completions for s in recent)
    if span <= 0 or done < 5:
        return default
    ongoing = sum(s.ongoing * s.duration_s for s in recent) / span
    return max(ongoing / (done / span), 1e-5)
