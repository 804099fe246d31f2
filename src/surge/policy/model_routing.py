"""Choose a replica for a multiplexed model: affinity first, spread when holders are full.

Ray Serve 2.60 sends a model's requests to replicas that hold or are loading it, else to
those with the fewest models, and to any replica only after a random 1-2 s matching
timeout; a hot model stays pinned to the replicas that first loaded it. Here, given
per replica its in-flight count, whether it *holds* the model (loaded, loading, or
reserved: this router already sent it a request for the model, so it will be loading
it), and how many models it holds:

1. a holder with room, by power of two choices among the holders;
2. when every holder is full (or there is none), and fewer than `max_copies` replicas
   hold the model, the replica with room that holds the fewest models (then the least
   loaded) loads another copy: a hot model spreads instead of queueing behind one
   replica; surplus copies leave by the replicas' LRU once the heat is gone;
3. with `fallback` (the request waited past the matching timeout), any replica with
   room.
Never a full replica: NO_REPLICA when nothing has room, and the router queues or
rejects as for any deployment.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from surge.policy.routing import NO_REPLICA, Loads, choose_replica

__all__ = ["NO_REPLICA", "choose_for_model"]


def choose_for_model(in_flight: Loads | Sequence[int], capacity: int, holds: Sequence[bool],
                     models_held: Sequence[int], max_copies: int, rng: random.Random,
                     fallback: bool = False) -> int:
    """Index of the replica for a request of one model, or NO_REPLICA.

    `max_copies` bounds how many replicas may hold the model (0: no bound)."""
    holders = [i for i, held in enumerate(holds) if held]
    with_room = [i for i in holders if in_flight[i] < capacity]
    if with_room:
        loads = [in_flight[i] for i in with_room]
        return with_room[choose_replica(loads, capacity, rng)]
    if max_copies <= 0 or len(holders) < max_copies:
        best, best_key = NO_REPLICA, None
        for index in range(len(in_flight)):
            load = in_flight[index]
            if holds[index] or load >= capacity:
                continue
            key = (models_held[index], load, rng.random())
            if best_key is None or key < best_key:
                best, best_key = index, key
        if best != NO_REPLICA:
            return best
    if fallback:
        return choose_replica(in_flight, capacity, rng)
    return NO_REPLICA
