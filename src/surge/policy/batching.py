"""`@serve.batch`'s decisions: how many waiting calls the next batch takes, which group
of calls leaves first, and when to wake for the next deadline.

replica/batching.py is the shell (the calls, their futures, the batches' tasks and the
timer); these functions decide on plain numbers and the times the shell passes in.
A group's next batch is full at `limit` calls (`max_batch_size`), or, with a size
function (`batch_size_fn`), once the next call would take its size past `limit` (a
first call is taken even if it alone is over: the shell refuses those at submit). A
group is ready when full or `timeout_s` after its first call arrived; the ready group
whose first call is oldest leaves first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["fill", "next_deadline", "oldest_ready"]


def fill(count: int, limit: int, size_of: Callable[[int], int] | None, head: int = 0,
         full: bool = False) -> tuple[int, bool]:
    """(calls the next batch takes, whether it is full) for `count` waiting calls.

    `size_of(n)`: the size of the first n calls together (None: each counts 1). With a
    size, measuring goes on from the last measure (`head`, `full`, taken with the same
    `limit`), since calls only arrive at the end."""
    if size_of is None:
        return min(count, limit), count >= limit
    while not full and head < count:
        size = size_of(head + 1)
        if size > limit and head > 0:
            full = True  # the next call would not fit: it starts the batch after
        else:
            head += 1
            full = size >= limit
    return head, full


def oldest_ready(groups: Sequence[tuple[float, bool]], timeout_s: float, now: float,
                 ) -> int | None:
    """Index of the ready group (full, or its first call `timeout_s` old) whose first
    call arrived first, the earliest listed on a tie; None when none is ready. `groups`:
    (its first call's arrival, full) each."""
    best: int | None = None
    for index, (first, full) in enumerate(groups):
        if (full or first + timeout_s <= now) and (best is None or first < groups[best][0]):
            best = index
    return best


def next_deadline(firsts: Sequence[float], timeout_s: float, now: float, slot_free: bool,
                  ) -> float | None:
    """When the next group's wait ends (its first call's arrival + `timeout_s`); one
    already past counts only while a batch slot is free (else the slot's freeing starts
    it). None: nothing to wake for."""
    return min((first + timeout_s for first in firsts
                if slot_free or first + timeout_s > now), default=None)
