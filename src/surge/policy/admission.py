"""Admit or reject a request against a bounded queue.

A deployment's `max_queued_requests` is one budget for all its callers: each router
holds a share (budget split over the routers that send to the deployment), so adding
callers never multiplies the total. Each router keeps at least one slot, so a budget
smaller than the number of routers admits one request per router. A rejection carries
the numbers and how long the caller should wait before retrying, estimated from how
fast the queue drains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Rejection", "admit", "queue_share", "retry_after_header", "retry_after_s"]

MIN_RETRY_AFTER_S = 0.1
MAX_RETRY_AFTER_S = 10.0


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


def admit(queued: int, limit: int, drain_per_s: float) -> Rejection | None:
    """None to admit; a Rejection when the queue already holds `limit` requests."""
    if queued < limit:
        return None
    return Rejection(
        queued=queued,
        limit=limit,
        retry_after_s=retry_after_s(queued, drain_per_s),
        reason="queue full" if limit > 0 else "no queueing allowed and all replicas busy",
    )


def retry_after_header(seconds: float) -> str:
    """HTTP Retry-After takes whole seconds; round up so clients never come back early."""
    return str(max(1, math.ceil(seconds)))
