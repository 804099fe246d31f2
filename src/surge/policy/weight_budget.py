"""Which weight-store entries make room for a new one: LRU under a byte budget.

The node's weight store (surge.weights) keeps every entry it materialised until room is
needed: an entry no replica references any more stays cached, so a model evicted from
a replica and asked for again maps in microseconds. When a new entry of `incoming`
bytes must fit, `make_room` evicts unreferenced entries, least recently used first,
until it fits the budget and the entry count; entries that replicas hold (or that are
being materialised) are never evicted. If evicting every unreferenced entry is not
enough, the answer is an `Overflow` with the numbers the error shows. Pure: the caller
passes each entry's last use as a number and performs the unlinks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Admit", "Overflow", "Resident", "make_room"]


@dataclass(frozen=True)
class Resident:
    """An entry the store holds: its size, how many references replicas hold on it, and
    when it was last asked for (any monotonic number; only the order matters)."""

    key: str
    nbytes: int
    refs: int
    last_used: float


@dataclass(frozen=True)
class Admit:
    """The new entry fits once `evict` (least recently used first) are gone."""

    evict: tuple[str, ...]
    used_after: int  # bytes held once the new entry is in


@dataclass(frozen=True)
class Overflow:
    """The new entry cannot fit: the referenced entries alone leave too little room."""

    incoming: int
    budget: int
    held: int  # bytes of entries that replicas reference (never evicted)
    held_keys: tuple[str, ...]
    max_entries: int

    @property
    def reason(self) -> str:
        if len(self.held_keys) >= self.max_entries:
            return (f"live replicas hold {len(self.held_keys)} entries, the most the store "
                    "keeps")
        if self.incoming > self.budget:
            return (f"the entry needs {self.incoming:,} bytes, more than the whole budget "
                    f"of {self.budget:,}")
        return (f"the entry needs {self.incoming:,} bytes; the budget is {self.budget:,} and "
                f"{self.held:,} are held by live replicas ({len(self.held_keys)} entries)")


def make_room(residents: Sequence[Resident], incoming: int, budget: int,
              max_entries: int) -> Admit | Overflow:
    """Evict the fewest least-recently-used unreferenced entries so that `incoming` bytes
    fit within `budget`, and one more entry within `max_entries`."""
    used, count = sum(r.nbytes for r in residents), len(residents)
    held = [r for r in residents if r.refs > 0]
    held_bytes = sum(r.nbytes for r in held)
    if incoming + held_bytes > budget or len(held) >= max_entries:
        return Overflow(incoming, budget, held_bytes, tuple(sorted(r.key for r in held)),
                        max_entries)
    evict: list[str] = []
    idle = sorted((r for r in residents if r.refs <= 0), key=lambda r: (r.last_used, r.key))
    for resident in idle:
        if used + incoming <= budget and count < max_entries:
            break
        evict.append(resident.key)
        used -= resident.nbytes
        count -= 1
    return Admit(tuple(evict), used + incoming)
