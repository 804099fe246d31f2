"""Choose a replica: power of two choices on in-flight counts.

The router keeps, per replica, how many of its own requests are in flight there (a
replica that just rejected counts as full). Two distinct replicas are sampled and the
less loaded one wins; if both are full, the least loaded replica with room is taken,
so a free replica is never missed. Returns -1 when every replica is full.

Locality (multi-node backends): the caller orders its replicas with those on its own
node first and passes how many there are (`local`). The choice is made among those
first and falls back to all replicas only when every local one is full, so a request
crosses the network only when its node has no room. `local` of 0 or of all replicas
means no preference (the local backend: one node).
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
                   rng: random.Random, local: int = 0) -> int:
    """Index of the replica to send to, or NO_REPLICA if all have `capacity` in flight.

    The first `local` replicas are on the caller's node and are preferred.
    """
    n = len(in_flight)
    if n == 1:  # one replica: nothing to sample, and no call (a queued request's choice)
        return 0 if in_flight[0] < capacity else NO_REPLICA
    if 0 < local < n:
        index = _choose(in_flight, capacity, rng, local)
        if index != NO_REPLICA:
            return index
    return _choose(in_flight, capacity, rng, n)


def _choose(in_flight: Loads | Sequence[int], capacity: int, rng: random.Random,
            n: int) -> int:
    """Power of two choices among the first `n` replicas."""
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
    return _least_loaded_with_room(in_flight, capacity, n)


def _least_loaded_with_room(in_flight: Loads | Sequence[int], capacity: int, n: int) -> int:
    best, best_load = NO_REPLICA, capacity
    for index in range(n):
        load = in_flight[index]
        if load < best_load:
            best, best_load = index, load
    return best
