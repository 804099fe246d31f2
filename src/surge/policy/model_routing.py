"""Choose a replica for a multiplexed model: affinity first, spread when holders are full.

Ray Serve 2.60 sends a model's requests to replicas that hold or are loading it, else to
those with the fewest models, and to any replica only after a random 1-2 s matching
timeout; a hot model stays pinned to the replicas that first loaded it. Here, given
per replica its in-flight count, whether it *holds* the model (loaded, loading, or
reserved: this router already sent it a request for the model, so it will be loading
it), and how many models it holds:

1. a holder with room, by power of two choices among the holders;
2. when every holder is full (or there is none), and fewer than `max_copies` replicas
   hold the model, a replica with room loads another copy: a hot model spreads instead
   of queueing behind one replica; surplus copies leave by the replicas' LRU once the
   heat is gone. Which one: where the load costs least, i.e. a replica with a free model
   slot, else the one whose least requested model is requested least (`coldest`: that
   is the model its LRU will most likely drop, so rare models churn where they evict
   other rare ones and popular ones stay resident), then the fewest models, then the
   least loaded;
3. with `fallback` (the request waited past the matching timeout), any replica with
   room.
Never a full replica: NO_REPLICA when nothing has room, and the router queues or
rejects as for any deployment.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Sequence

from surge.policy.routing import NO_REPLICA, Loads, choose_replica

__all__ = ["FREE_SLOT", "NO_REPLICA", "ModelHeat", "choose_for_model"]

FREE_SLOT = -1.0  # a `coldest` entry: the replica has room for another model


def choose_for_model(in_flight: Loads | Sequence[int], capacity: int, holds: Sequence[bool],
                     models_held: Sequence[int], max_copies: int, rng: random.Random,
                     fallback: bool = False, coldest: Sequence[float] | None = None) -> int:
    """Index of the replica for a request of one model, or NO_REPLICA.

    `max_copies` bounds how many replicas may hold the model (0: no bound); `coldest[i]`
    is the heat of the least requested model replica i holds, FREE_SLOT when it has room
    for one more (None: placement by the number of models alone)."""
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
            cost = coldest[index] if coldest is not None else 0.0
            key = (cost, models_held[index], load, rng.random())
            if best_key is None or key < best_key:
                best, best_key = index, key
        if best != NO_REPLICA:
            return best
    if fallback:
        return choose_replica(in_flight, capacity, rng)
    return NO_REPLICA


class ModelHeat:
    """How often each model is requested: counts that halve every `half_life_s`."""

    __slots__ = ("_counts", "half_life_s", "limit")

    def __init__(self, half_life_s: float = 30.0, limit: int = 4096) -> None:
        self.half_life_s = half_life_s
        self.limit = limit  # models remembered; past it the coldest half is forgotten
        self._counts: dict[Hashable, tuple[float, float]] = {}  # model -> (count, when)

    def __len__(self) -> int:
        return len(self._counts)

    def value(self, model: Hashable, now: float) -> float:
        entry = self._counts.get(model)
        if entry is None:
            return 0.0
        count, when = entry
        return float(count * 0.5 ** ((now - when) / self.half_life_s))

    def hit(self, model: Hashable, now: float) -> None:
        self._counts[model] = (self.value(model, now) + 1.0, now)
        if len(self._counts) > self.limit:
            ranked = sorted(self._counts, key=lambda m: self.value(m, now))
            for cold in ranked[:len(ranked) // 2]:
                del self._counts[cold]

    def coldest(self, models: Iterable[Hashable], now: float) -> float:
        """The heat of the least requested of `models` (0.0 when there is none)."""
        return min((self.value(m, now) for m in models), default=0.0)
