"""The router's decisions on plain data: refuse or queue, drain the queue, what an
answer means, the multiplexed models' settings and the completion rate.

router/router.py is the shell: it holds the links (router/pool.py), the queue and the
timers, asks these functions what to do, and does it. Nothing here does I/O, touches
a loop or takes a lock; time is passed in (the router's injected clock). The choice of
a replica itself is policy/routing.py (power of two choices), policy/model_routing.py
(multiplexed models) and policy/engine_routing.py (engines' queues, affinity).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from surge.policy.admission import DUST, admit, drain_rate

__all__ = ["MATCHING_TIMEOUT_S", "MODEL_SCAN_LIMIT", "REFUSED_STATUSES", "SATURATION_HOLD_S",
           "SHED_HEADER", "Answer", "CompletionRate", "Refusal", "after_rejection", "drain",
           "model_settings", "next_matching_due", "queues_at_any_load", "refuse",
           "retry_shed", "served"]

# How long a replica that rejected (or shed) is held as full if it sends nothing else.
SATURATION_HOLD_S = 0.02
# Until a multiplexed replica tells its own (Models frames).
MATCHING_TIMEOUT_S = 1.0
# Queue entries one drain looks at for a model request that can go (the rest wait).
MODEL_SCAN_LIMIT = 64
# The window over which the completion rate (a count bound's Retry-After) is measured.
RATE_WINDOW_S = 0.5

T = TypeVar("T")


@dataclass(frozen=True)
class Refusal:
    """A request not queued: BackPressureError's fields."""

    queued: int
    limit: int
    retry_after_s: float
    status_code: int
    reason: str
    advise_retry: bool


def refuse(queued: int, limit: int, max_wait_s: float | None, in_flight: int,
           service_s: float, completions_per_s: float, fixed_retry_after_s: float | None,
           status_code: int) -> Refusal | None:
    """None to queue a request with `queued` ahead of it; else why not.

    Bounded by count (`max_wait_s` None, Ray's way) the Retry-After comes from the
    completions measured and is advised only when the deployment fixes one (as Ray);
    bounded by time it comes from the requests in flight and their service time and is
    always advised (policy/admission.py)."""
    rate = (completions_per_s if max_wait_s is None else drain_rate(in_flight, service_s))
    rejection = admit(queued, limit, rate, max_wait_s, service_s)
    if rejection is None:
        return None
    return Refusal(
        queued=rejection.queued, limit=rejection.limit,
        retry_after_s=(rejection.retry_after_s if fixed_retry_after_s is None
                       else fixed_retry_after_s),
        status_code=status_code,
        reason="" if max_wait_s is None else rejection.reason,
        advise_retry=fixed_retry_after_s is not None or max_wait_s is not None)


def queues_at_any_load(queued: int, limit: int, max_wait_s: float | None,
                       service_s: float) -> bool:
    """Whether `refuse` queues a request with `queued` ahead of it whatever the
    in-flight count and completion rate passed: the router's short path, which then
    reads neither (most requests that wait find room). A request that fits with one
    request in flight fits with more (they drain faster)."""
    if queued >= limit:
        return False
    if max_wait_s is None or service_s <= 0.0:  # (0.0: a float comparison, specialised)
        return True  # no bound by time (queue_room's None), or no rate known yet
    # queue_room(drain_rate(1, service_s), ...) inline (every request that queues asks):
    # queued < floor(room) is queued + 1 <= room, and an infinite room bounds nothing;
    # max(max_wait_s, service_s) written out as max decides it, without the builtin's call
    longer = service_s if service_s > max_wait_s else max_wait_s
    return queued + 1 <= longer * (1 / service_s) + DUST


# A replica's own "not now" answers (an LLM replica sheds with 429 + Retry-After; an app
# may answer 503): answered at once, so they measure no service time.
REFUSED_STATUSES = frozenset({429, 503})


# What an LLM replica's shed (429) carries: this replica's engine is behind, another's
# may not be (llm/asgi.py sets it; the router tries one other replica first).
SHED_HEADER = b"x-surge-shed"


def retry_shed(status: int, headers: Iterable[tuple[bytes, bytes]], shed_before: bool,
               resendable: bool, replicas: int) -> bool:
    """Whether a replica's final answer is a shed to try once on another replica before
    the caller hears it: a 429 marked SHED_HEADER, for a request not shed before whose
    body the router still holds whole (not pinned to that replica, not cancelled: the
    caller checks), while the deployment has another routable replica (of `replicas`).
    One replica's backlog says nothing of the others': the router's choice weighs
    sequences, the shed weighs prompt tokens, so most sheds of a deployment with room
    elsewhere were avoidable (helper-75: 94-98% of them on 4 simulated replicas)."""
    return (status == 429 and not shed_before and resendable and replicas > 1
            and any(name == SHED_HEADER for name, _ in headers))


def served(status: int | None) -> bool:
    """Whether a final answer counts as a completion: not a replica's refusal. (None: not
    an HTTP answer.) Counted as completions, a shedding LLM replica's 429s, answered in a
    millisecond, read as requests served in one: Little's law's service time fell by the
    shed share and the autoscaler sized for less while it shed."""
    return status not in REFUSED_STATUSES


class CompletionRate:
    """Completions a second, measured over windows of at least RATE_WINDOW_S from a
    running total the caller keeps (its count of answers: nothing to call per answer)."""

    __slots__ = ("_at_start", "_per_s", "_started")

    def __init__(self, now: float, completed: int = 0) -> None:
        self._started = now
        self._at_start = completed
        self._per_s = 0.0

    def per_s(self, now: float, completed: int) -> float:
        """The rate of the last whole window, `completed` being the total so far."""
        elapsed = now - self._started
        if elapsed >= RATE_WINDOW_S:
            self._per_s = (completed - self._at_start) / elapsed
            self._started, self._at_start = now, completed
        return self._per_s


def model_settings(frames: Iterable[tuple[int, float] | None], replicas: int,
                   ) -> tuple[int, float]:
    """(max_copies, matching_timeout_s): the first replica's that says (its Models
    frame's `max_copies`, 0 for the default, and `matching_timeout_s`); the default
    copies are half the replicas, at least 2."""
    default_copies = max(2, replicas // 2)
    for frame in frames:
        if frame is not None:
            copies, timeout_s = frame
            return copies or default_copies, timeout_s
    return default_copies, MATCHING_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class Answer:
    """What to do with a request its replica rejected (full with other routers' requests).

    Any other final frame needs no deciding: the request is done, its replica has room
    again as far as this router knows, and the frame reaches the caller unless the
    request was cancelled (the router does that inline: every request comes that way)."""

    saturate: bool  # hold its replica as full for a moment
    resend_later: bool  # try the same replica again in a moment (pinned)
    requeue: bool  # back to the head of the queue


@functools.cache  # (16 cases, made once each)
def after_rejection(routable: bool, saturated: bool, pinned: bool, cancelled: bool) -> Answer:
    """A rejection holds its replica as full (if still routable and not held already)
    and sends the request again: to the replica it is pinned to, else through the
    queue's head, unless it was cancelled."""
    return Answer(saturate=routable and not saturated, resend_later=pinned,
                  requeue=not pinned and not cancelled)


def drain(queue: deque[T], model_of: Callable[[T], str], cancelled: Callable[[T], bool],
          choose: Callable[[T], int], send: Callable[[T, int], None]) -> deque[T]:
    """Send queued requests while they can go; the queue left.

    In order, while the head can go (`choose` gives a replica's index, negative for
    none). Once a request for a multiplexed model is at the head, the first
    MODEL_SCAN_LIMIT live entries are each tried in order, so one waiting for its model
    does not hold up the rest; a plain request that cannot go ends the scan (every
    replica is full). `send` is called for each one that goes, before the next choice
    (it changes the loads)."""
    while queue:
        head = queue[0]
        if model_of(head):
            return _scan(queue, model_of, cancelled, choose, send)
        index = choose(head)
        if index < 0:
            return queue
        queue.popleft()
        if not cancelled(head):
            send(head, index)
    return queue


def _scan(queue: deque[T], model_of: Callable[[T], str], cancelled: Callable[[T], bool],
          choose: Callable[[T], int], send: Callable[[T, int], None]) -> deque[T]:
    kept: deque[T] = deque()
    scanned = 0
    while queue and scanned < MODEL_SCAN_LIMIT:
        entry = queue.popleft()
        if cancelled(entry):
            continue
        scanned += 1
        index = choose(entry)
        if index < 0:
            kept.append(entry)
            if not model_of(entry):  # every replica is full: nothing else can go either
                break
            continue
        send(entry, index)
    kept.extend(queue)
    return kept


def next_matching_due(queued_at: Iterable[float], timeout_s: float, now: float,
                      ) -> float | None:
    """Seconds until the earliest waiting model request may go to any replica (at
    least 10 ms: a timer, not a spin); None when none waits."""
    waiting = list(queued_at)
    if not waiting:
        return None
    return max(min(waiting) + timeout_s - now, 0.01)
