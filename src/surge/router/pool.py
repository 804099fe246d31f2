"""A router's replicas: one link to each, the routable ones in order, and their load.

`links` holds a link per replica from when the router starts connecting to it; a
replica becomes routable (a `Slot`, router/slots.py) once its link is open and trusted.
Routable slots on the router's own node come first (`local` of them), which is how
policy/routing.py prefers them. `loads` is the in-flight count per routable slot that
the policies sample, the callers' threads' own links (own_links.py) included;
`prefixes` what the replicas' engines hold of which prompts (policy/prefix_index.py),
forgotten for a replica when it stops being routable; `prompt_names` the last prompts
routed and their chunk names (policy/prompt_names.py).

No I/O of its own and no lock: the router calls it with its lock held.
"""

from __future__ import annotations

from collections.abc import Iterator

from surge.model import ReplicaInfo
from surge.policy.prefix_index import PrefixIndex
from surge.policy.prompt_names import PromptNames
from surge.router.own_links import OwnLinks
from surge.router.replica_link import ReplicaLink
from surge.router.slots import Loads, Slot

__all__ = ["ReplicaPool"]


class ReplicaPool:
    def __init__(self, node_id: str, own_links: OwnLinks) -> None:
        self.node_id = node_id
        self.own_links = own_links
        self.links: dict[str, ReplicaLink] = {}  # connecting or routable
        self.routable: list[Slot] = []
        self.by_id: dict[str, Slot] = {}
        self.local = 0  # the first `local` routable slots are on this router's node
        self.loads = Loads(self.routable, 1, own_links)
        # What each replica's engine holds of which prompts (LLM deployments only).
        self.prefixes = PrefixIndex()
        self.prompt_names = PromptNames()  # recent prompts: not hashed again
        self._positions: dict[str, int] | None = None  # replica id -> routable index

    def __len__(self) -> int:
        return len(self.routable)

    @property
    def in_flight(self) -> int:
        # (asked at every request queued: a list's sum, no generator resumed per link)
        return sum([len(link.in_flight) for link in self.links.values()]) + (
            self.own_links.in_flight() if self.own_links.links else 0)

    def model_frames(self) -> Iterator[tuple[int, float] | None]:
        """Each routable replica's multiplexing settings, None until its Models frame."""
        for slot in self.routable:
            models = slot.link.models
            yield None if models is None else (models.max_copies, models.matching_timeout_s)

    def positions(self) -> dict[str, int]:
        """Each routable replica's index in `routable` (rebuilt after a change)."""
        if self._positions is None:
            self._positions = {s.info.replica_id: i for i, s in enumerate(self.routable)}
        return self._positions

    def add(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        """The replica's link is open and trusted: route to it."""
        self._positions = None
        slot = Slot(info, link)
        self.by_id[info.replica_id] = slot
        if info.node_id == self.node_id:
            self.routable.insert(self.local, slot)
            self.local += 1
        else:
            self.routable.append(slot)

    def _remove(self, slot: Slot) -> None:
        self._positions = None
        index = self.routable.index(slot)
        del self.routable[index]
        if index < self.local:
            self.local -= 1
        self.prefixes.drop(slot.info.replica_id)

    def unroute(self, replica_id: str) -> None:
        """The replica left the set: route nothing more to it; its links close once
        their last answer came."""
        slot = self.by_id.pop(replica_id, None)
        if slot is not None:
            self._remove(slot)
            for link in [slot.link, *self.own_links.unroute(replica_id)]:
                if not link.in_flight:
                    self.retire(link)

    def retire(self, link: ReplicaLink) -> None:
        link.close()
        self.own_links.links.discard(link)
        if self.links.get(link.replica_id) is link:
            del self.links[link.replica_id]
        if link.replica_id not in self.by_id:  # gone: nothing of its may stay indexed
            self.prefixes.drop(link.replica_id)

    def lost(self, link: ReplicaLink) -> bool:
        """The router's link to a replica closed: whether that replica was routable."""
        if self.links.get(link.replica_id) is link:
            del self.links[link.replica_id]
        slot = self.by_id.pop(link.replica_id, None)
        if slot is None:
            return False
        self._remove(slot)
        self.own_links.reclaim_replica(link.replica_id)  # their transports see it go, too
        return True

    def close(self) -> None:
        self.routable.clear()  # no caller's thread may start a request any more
        self.by_id.clear()
        self.prefixes = PrefixIndex()
        self._positions = None
        self.local = 0
        for link in self.links.values():
            link.close()
        self.links.clear()
        self.own_links.close()
