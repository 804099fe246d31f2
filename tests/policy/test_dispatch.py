"""The router's decisions on plain data (policy/dispatch.py): tables, no I/O."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.policy.dispatch import (
    MATCHING_TIMEOUT_S,
    MODEL_SCAN_LIMIT,
    SHED_HEADER,
    Answer,
    CompletionRate,
    Refusal,
    after_rejection,
    drain,
    model_settings,
    next_matching_due,
    queues_at_any_load,
    refuse,
    retry_shed,
    served,
)

# -- refuse -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queued", "limit", "max_wait_s", "in_flight", "service_s", "rate", "fixed", "expected"),
    [
        # room in the count bound: queued
        (3, 10, None, 4, 0.1, 5.0, None, None),
        # count bound full: Retry-After from the completions, not advised (Ray's way)
        (10, 10, None, 4, 0.1, 5.0, None, Refusal(10, 10, 2.0, 503, "", False)),
        # ... advised with the deployment's own Retry-After
        (10, 10, None, 4, 0.1, 5.0, 7.0, Refusal(10, 10, 7.0, 503, "", True)),
        # time bound: 4 in flight of 0.1 s drain 40/s, so 4 may wait 0.1 s; the 5th not
        (3, 100, 0.1, 4, 0.1, 999.0, None, None),
        (4, 100, 0.1, 4, 0.1, 999.0, None, Refusal(
            4, 100, 0.1, 429,
            "it would wait ~0.125s for a replica, over the deployment's max_queue_wait_s "
            "(0.1s)", True)),
        # time bound with nothing running yet: only the count applies
        (50, 100, 0.1, 0, 0.0, 999.0, None, None),
    ])
def test_refuse(queued: int, limit: int, max_wait_s: float | None, in_flight: int,
                service_s: float, rate: float, fixed: float | None,
                expected: Refusal | None) -> None:
    status = 429 if max_wait_s is not None else 503
    assert refuse(queued, limit, max_wait_s, in_flight, service_s, rate, fixed,
                  status) == expected


@pytest.mark.parametrize(
    ("queued", "limit", "max_wait_s", "service_s", "expected"),
    [
        (9, 10, None, 0.1, True),  # bounded by count: the count alone decides
        (10, 10, None, 0.1, False),
        (50, 100, 0.1, 0.0, True),  # no service time yet: only the count applies
        (100, 100, 0.1, 0.0, False),
        # 0.1 s of 0.01 s requests: at one in flight 10 may wait; the 11th depends on
        # how many are in flight, so the router asks refuse
        (9, 100, 0.1, 0.01, True),
        (10, 100, 0.1, 0.01, False),
        (0, 100, 0.1, 0.5, True),  # a slow model may wait one service time
        (1, 100, 0.1, 0.5, False),
    ])
def test_queues_at_any_load(queued: int, limit: int, max_wait_s: float | None,
                            service_s: float, expected: bool) -> None:
    assert queues_at_any_load(queued, limit, max_wait_s, service_s) is expected


@given(st.integers(min_value=0, max_value=10**4), st.integers(min_value=0, max_value=10**4),
       st.one_of(st.none(), st.floats(min_value=1e-6, max_value=1e3)),
       st.floats(min_value=0.0, max_value=10.0), st.integers(min_value=-1, max_value=10**4),
       st.floats(min_value=0.0, max_value=1e6))
def test_the_short_path_queues_only_what_refuse_queues(
        queued: int, limit: int, max_wait_s: float | None, service_s: float, in_flight: int,
        rate: float) -> None:
    """What the short path queues, refuse queues at every in-flight count and rate; the
    one in flight at which it stops being sure, refuse does refuse (it is exact there)."""
    if queues_at_any_load(queued, limit, max_wait_s, service_s):
        assert refuse(queued, limit, max_wait_s, in_flight, service_s, rate, None,
                      429) is None
    elif queued < limit:
        assert max_wait_s is not None and service_s > 0
        assert refuse(queued, limit, max_wait_s, 1, service_s, rate, None, 429) is not None
    else:
        assert refuse(queued, limit, max_wait_s, in_flight, service_s, rate, None,
                      429) is not None


# -- completion rate ----------------------------------------------------------------------


def test_the_completion_rate_is_measured_over_half_second_windows() -> None:
    rate = CompletionRate(now=10.0, completed=3)  # 3 done before it started
    assert rate.per_s(10.4, 8) == 0.0  # the window is not over: the last measure (none)
    assert rate.per_s(11.0, 8) == 5.0  # 5 in 1 s; a new window starts
    assert rate.per_s(11.2, 9) == 5.0  # kept until the new window is over
    assert rate.per_s(11.5, 9) == 2.0  # 1 in 0.5 s


# -- model settings -----------------------------------------------------------------------


@pytest.mark.parametrize(("frames", "replicas", "expected"), [
    ([], 0, (2, MATCHING_TIMEOUT_S)),  # nobody said: half the replicas, at least 2
    ([None, None], 10, (5, MATCHING_TIMEOUT_S)),
    ([None, (3, 0.5), (9, 9.0)], 10, (3, 0.5)),  # the first replica that says
    ([(0, 2.0)], 8, (4, 2.0)),  # max_copies 0: the default
])
def test_model_settings(frames: list[tuple[int, float] | None], replicas: int,
                        expected: tuple[int, float]) -> None:
    assert model_settings(frames, replicas) == expected


# -- what an answer means -----------------------------------------------------------------


@pytest.mark.parametrize(("routable", "saturated", "pinned", "cancelled", "expected"), [
    # hold the replica as full, back to the head of the queue
    (True, False, False, False, Answer(True, False, True)),
    # ... already held: not again
    (True, True, False, False, Answer(False, False, True)),
    # ... from a replica gone meanwhile: nothing to hold
    (False, False, False, False, Answer(False, False, True)),
    # ... pinned to that replica (a reservation's dispatch): try it again, not the queue
    (True, False, True, False, Answer(True, True, False)),
    # ... cancelled meanwhile: it goes nowhere
    (True, False, False, True, Answer(True, False, False)),
])
def test_after_rejection(routable: bool, saturated: bool, pinned: bool, cancelled: bool,
                         expected: Answer) -> None:
    assert after_rejection(routable, saturated, pinned, cancelled) == expected


# -- draining the queue -------------------------------------------------------------------


@dataclass
class Waiting:
    name: str
    model: str = ""
    cancelled: bool = False


def run_drain(queue: list[Waiting], room: dict[str, int], capacity: int = 2,
              ) -> tuple[list[tuple[str, int]], list[str]]:
    """Drain on plain loads: `room` is which replicas (by index) each model may go to
    ("" for a plain request: any); each send fills a slot. Returns (sent as (name,
    replica index), what is left queued)."""
    loads = [0, 0]
    sent: list[tuple[str, int]] = []

    def choose(entry: Waiting) -> int:
        allowed = room.get(entry.model, -1)
        for index, load in enumerate(loads):
            if load < capacity and allowed in (-1, index):
                return index
        return -1

    def send(entry: Waiting, index: int) -> None:
        loads[index] += 1
        sent.append((entry.name, index))

    left = drain(deque(queue), lambda w: w.model, lambda w: w.cancelled, choose, send)
    return sent, [w.name for w in left]


def test_plain_requests_go_in_order_until_every_replica_is_full() -> None:
    queue = [Waiting(str(i)) for i in range(6)]
    sent, left = run_drain(queue, {})
    assert sent == [("0", 0), ("1", 0), ("2", 1), ("3", 1)]
    assert left == ["4", "5"]


def test_a_cancelled_head_is_dropped_when_it_could_go() -> None:
    sent, left = run_drain([Waiting("x", cancelled=True), Waiting("a")], {})
    assert sent == [("a", 0)]
    assert left == []


def test_a_cancelled_head_waits_when_nothing_can_go() -> None:
    sent, left = run_drain([Waiting("x", cancelled=True)], {}, capacity=0)
    assert (sent, left) == ([], ["x"])


def test_a_waiting_model_does_not_hold_up_the_rest() -> None:
    # model m may go only to replica 1, which fills; n and the plain ones go on
    queue = [Waiting("m1", "m"), Waiting("m2", "m"), Waiting("m3", "m"),
             Waiting("gone", "n", cancelled=True), Waiting("n1", "n"), Waiting("p1")]
    sent, left = run_drain(queue, {"m": 1, "n": 0})
    assert sent == [("m1", 1), ("m2", 1), ("n1", 0), ("p1", 0)]
    assert left == ["m3"]


def test_a_plain_request_that_cannot_go_ends_the_scan() -> None:
    queue = [Waiting("m1", "m"), Waiting("p1"), Waiting("m2", "m")]
    sent, left = run_drain(queue, {"m": 1}, capacity=0)
    assert sent == []
    assert left == ["m1", "p1", "m2"]  # m2 not looked at, and still in order


def test_the_scan_looks_at_a_bounded_number_of_entries() -> None:
    queue = [Waiting(f"w{i}", "w") for i in range(MODEL_SCAN_LIMIT)] + [Waiting("late")]
    sent, left = run_drain(queue, {"w": 5})  # no replica 5: no w can go
    assert sent == []
    assert left[-1] == "late" and len(left) == MODEL_SCAN_LIMIT + 1


# -- the matching timer -------------------------------------------------------------------


@pytest.mark.parametrize(("queued_at", "now", "expected"), [
    ([], 5.0, None),
    ([4.5, 4.2], 5.0, pytest.approx(0.2)),  # the oldest: 4.2 + 1.0 - 5.0
    ([1.0], 5.0, 0.01),  # overdue: at once, but on a timer
])
def test_next_matching_due(queued_at: list[float], now: float,
                           expected: float | None) -> None:
    assert next_matching_due(queued_at, 1.0, now) == expected


@pytest.mark.parametrize(("status", "expected"), [
    (None, True), (200, True), (500, True), (404, True), (429, False), (503, False)])
def test_a_replicas_own_refusal_is_no_completion(status: int | None, expected: bool) -> None:
    assert served(status) is expected


MARKED = [(b"content-type", b"application/json"), (SHED_HEADER, b"1")]


@pytest.mark.parametrize(("status", "headers", "shed_before", "resendable", "replicas",
                          "expected"), [
    (429, MARKED, False, True, 2, True),     # a replica's engine is behind: try another
    (429, MARKED, True, True, 2, False),     # ... once: the second shed is the answer
    (429, MARKED, False, True, 1, False),    # ... if there is another replica
    (429, MARKED, False, False, 2, False),   # its body went on in frames: not held
    (429, MARKED[:1], False, True, 2, False),  # an app's own 429: its answer
    (503, MARKED, False, True, 2, False),
    (200, MARKED, False, True, 2, False),
])
def test_a_shed_is_tried_once_elsewhere(status: int, headers: list[tuple[bytes, bytes]],
                                        shed_before: bool, resendable: bool, replicas: int,
                                        expected: bool) -> None:
    assert retry_shed(status, headers, shed_before, resendable, replicas) is expected
