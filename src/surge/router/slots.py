"""A router's view of one replica (`Slot`) and of all of them (`Loads`).

A slot is one routable replica: its link, whether it rejected lately (saturated), and
the multiplexed models this router sent it requests for (reservations: the replica holds
or loads them before its Models frame says so). `Loads` is the in-flight counts that
policy/routing.py samples, counting the callers' threads' own links too.
"""

from __future__ import annotations

from surge.model import ReplicaInfo
from surge.policy.model_routing import FREE_SLOT, ModelHeat
from surge.router.own_links import OwnLinks
from surge.router.replica_link import ReplicaLink

__all__ = ["Loads", "Slot"]


class Slot:
    __slots__ = ("info", "link", "reserved", "saturated")

    def __init__(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        self.info = info
        self.link = link
        self.saturated = False
        # Models this router sent requests for that have not ended: the replica holds or
        # loads them before its Models frame can say so.
        self.reserved: dict[str, int] = {}

    def holds(self, model: str) -> bool:
        return model in self.link.model_set or model in self.reserved

    def models_held(self) -> int:
        held = self.link.model_set
        return len(held) + sum(1 for m in self.reserved if m not in held)

    def coldest(self, heat: ModelHeat, now: float) -> float:
        """What loading one more model here would evict (policy/model_routing.py)."""
        models = self.link.models
        held = self.link.model_set.union(self.reserved)
        if models is None or models.capacity < 0 or len(held) < models.capacity:
            return FREE_SLOT
        return heat.coldest(held, now)

    def reserve(self, model: str) -> None:
        self.reserved[model] = self.reserved.get(model, 0) + 1

    def release(self, model: str) -> None:
        left = self.reserved.get(model, 0) - 1
        if left > 0:
            self.reserved[model] = left
        else:
            self.reserved.pop(model, None)


class Loads:
    """In-flight counts as a lazy sequence, so picking two replicas costs O(1)."""

    __slots__ = ("capacity", "own", "slots")

    def __init__(self, slots: list[Slot], capacity: int, own: OwnLinks) -> None:
        self.slots = slots
        self.capacity = capacity
        self.own = own

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, index: int) -> int:
        slot = self.slots[index]
        if slot.saturated:
            return self.capacity
        own = self.own
        if own.links:  # (a sync handle's threads' links; a proxy has none: no call)
            return len(slot.link.in_flight) + own.load(slot.info.replica_id)
        return len(slot.link.in_flight)
