"""Admit or reject a request against a bounded queue: bounded by time, or by count.

A deployment's `max_queued_requests` is one budget for all its callers: each router
holds a share (budget split over the routers that send to the deployment), so adding
callers never multiplies the total. Each router keeps at least one slot, so a budget
smaller than the number of routers admits one request per router.

When `max_queued_requests` is unset (-1, Ray's default) the queue is bounded by time
instead: a request that would wait longer than `max_queue_wait_s` for a replica is
refused at once, not queued (surge's own option; the count stays as a memory bound).
Its wait is estimated with Little's law: a router with `in_flight` requests running,
each taking `service_s`, finishes `in_flight / service_s` a second, so a request with
`queued` ahead of it waits `(queued + 1) * service_s / in_flight`. That rate is right
the moment the replicas fill up (which is when anything queues), where a measured
completion rate still reflects the quieter second before. A request may always wait
as long as one takes to serve (a slow model still queues), and while no rate is known
(nothing finished yet, nothing running: a cold start) only the count applies.

A rejection carries the numbers and how long the caller should wait before retrying,
the time the queue takes to drain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Rejection", "admit", "drain_rate", "queue_room", "queue_share",
           "retry_after_header", "retry_after_s", "smoothed"]

MIN_RETRY_AFTER_S = 0.1
MAX_RETRY_AFTER_S = 10.0
# Weight of each new service-time sample: ~20 completions (40 ms at 500 req/s) move the
# estimate most of the way to a new level, one outlier moves it 5%.
SERVICE_TIME_WEIGHT = 0.05
# Float dust in budget x rate (0.1 s x 500/s must give 50, not 49).
DUST = 1e-9


@dataclass(frozen=True)
class Rejection:
    queued: int
    limit: int
    retry_after_s: float
    reason: str


def queue_share(budget: int, routers: int) -> int:
    """One router's share of a deployment-wide budget: at least 1, never above the budget."""
    if budget <= 0:
        return 0
    return max(1, budget // max(1, routers))


def retry_after_s(queued: int, drain_per_s: float) -> float:
    """Seconds until a queue of `queued` requests has drained at `drain_per_s`."""
    if drain_per_s <= 0:
        return MAX_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, queued / drain_per_s))


def drain_rate(in_flight: int, service_s: float) -> float:
    """Requests a second that `in_flight` running requests of `service_s` each finish
    (Little's law); 0 when either is unknown."""
    if in_flight <= 0 or service_s <= 0:
        return 0.0
    return in_flight / service_s


def queue_room(drain_per_s: float, max_wait_s: float | None, service_s: float = 0.0,
               ) -> int | None:
    """How many requests may wait at `drain_per_s` without the last one waiting longer
    than `max_wait_s` or one service time, whichever is longer; None: no bound by time
    (none asked for, or no rate known yet)."""
    if max_wait_s is None or drain_per_s <= 0:
        return None
    room = max(max_wait_s, service_s) * drain_per_s + DUST
    return math.floor(room) if math.isfinite(room) else None


def smoothed(previous: float, sample: float) -> float:
    """The service-time estimate after one more sample (the first sample is taken whole)."""
    if previous <= 0.0:  # (a float against a float: the interpreter's specialised compare)
        return sample
    return previous + SERVICE_TIME_WEIGHT * (sample - previous)


def admit(queued: int, limit: int, drain_per_s: float, max_wait_s: float | None = None,
          service_s: float = 0.0) -> Rejection | None:
    """None to admit a request with `queued` ahead of it; a Rejection when the queue
    already holds `limit`, or (with `max_wait_s`) when at `drain_per_s` it would wait
    longer than `max_wait_s` or one service time, whichever is longer."""
    if queued >= limit:
        return Rejection(
            queued=queued, limit=limit, retry_after_s=retry_after_s(queued, drain_per_s),
            reason="queue full" if limit > 0 else "no queueing allowed and all replicas busy")
    room = queue_room(drain_per_s, max_wait_s, service_s)
    if room is None or queued < room:
        return None
    wait = (queued + 1) / drain_per_s
    return Rejection(queued=queued, limit=limit,
                     retry_after_s=retry_after_s(queued, drain_per_s),
                     reason=f"it would wait ~{wait:.3f}s for a replica, over the "
                            f"deployment's max_queue_wait_s "
                            f"({max(max_wait_s or 0.0, service_s):g}s)")


def retry_after_header(seconds: float) -> str:
    """HTTP Retry-After takes whole seconds (RFC 9110 delay-seconds, never negative);
    round up so clients never come back early. A configured 0 stays 0, as Ray's; surge's
    own estimates are never under MIN_RETRY_AFTER_S, so they advise at least 1."""
    return str(max(0, math.ceil(seconds)))
