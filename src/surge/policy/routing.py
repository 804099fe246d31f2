"""Choose a replica: power of two choices on in-flight counts.

The router keeps, per replica, how many of its own requests are in flight there (a
replica that just rejected counts as full). Two distinct replicas are sampled and the
less loaded one wins; if both are full, the least loaded replica with room is taken,
so a free replica is never missed. Returns -1 when every replica is full.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

__all__ = ["NO_REPLICA", "choose_replica"]

NO_REPLICA = -1


class Loads(Protocol):
    """In-flight count per replica; anything with len() and [] (a list works)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> int: ...


def choose_replica(in_flight: Loads | Sequence[int], capacity: int,
                   rng: random.Random) -> int:
    """Index of the replica to send to, or NO_REPLICA if all have `capacity` in flight."""
    n = len(in_flight)
    if n == 0:
        return NO_REPLICA
    if n == 1:
        return 0 if in_flight[0] < capacity else NO_REPLICA
    first = rng.randrange(n)
    second = rng.randrange(n - 1)
    if second >= first:
        second += 1
    best = first if in_flight[first] <= in_flight[second] else second
    if in_flight[best] < capacity:
        return best
    return _least_loaded_with_room(in_flight, capacity)


def _least_loaded_with_room(in_flight: Loads | Sequence[int], capacity: int) -> int:
    best, best_load = NO_REPLICA, capacity
    for index in range(len(in_flight)):
        load = in_flight[index]
        if load < best_load:
            best, best_load = index, load
    return best
