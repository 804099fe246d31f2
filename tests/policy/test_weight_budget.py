"""policy.weight_budget: which entries make room, as a table."""

from __future__ import annotations

import pytest

from surge.policy.weight_budget import Admit, Overflow, Resident, make_room

MiB = 1 << 20


def r(key: str, mib: int, refs: int = 0, last_used: float = 0.0) -> Resident:
    return Resident(key, mib * MiB, refs, last_used)


@pytest.mark.parametrize(("residents", "incoming", "budget", "evict"), [
    ([], 4, 10, ()),  # empty store
    ([r("a", 3), r("b", 3)], 4, 10, ()),  # fits as it is
    ([r("a", 3, last_used=2), r("b", 3, last_used=1)], 5, 10, ("b",)),  # oldest goes first
    ([r("a", 3, last_used=1), r("b", 3, last_used=1)], 5, 10, ("a",)),  # a tie: by key
    ([r("a", 3, last_used=1), r("b", 3, last_used=2), r("c", 3, last_used=3)], 7, 10,
     ("a", "b")),  # as many as needed, no more
    ([r("a", 3, refs=1, last_used=0), r("b", 3, last_used=5)], 5, 10, ("b",)),  # held: kept
    ([r("a", 6, refs=2)], 4, 10, ()),  # exactly full is fine
])
def test_least_recently_used_unreferenced_entries_make_room(
        residents: list[Resident], incoming: int, budget: int, evict: tuple[str, ...]) -> None:
    decision = make_room(residents, incoming * MiB, budget * MiB, max_entries=100)
    assert decision == Admit(evict, sum(x.nbytes for x in residents if x.key not in evict)
                             + incoming * MiB)


def test_entries_that_replicas_hold_are_never_evicted() -> None:
    decision = make_room([r("a", 6, refs=1), r("b", 3)], 5 * MiB, 10 * MiB, max_entries=100)
    assert decision == Overflow(5 * MiB, 10 * MiB, 6 * MiB, ("a",), 100)
    assert decision.reason == (f"the entry needs {5 * MiB:,} bytes; the budget is "
                               f"{10 * MiB:,} and {6 * MiB:,} are held by live replicas "
                               "(1 entries)")


def test_an_entry_larger_than_the_budget_says_so() -> None:
    decision = make_room([], 11 * MiB, 10 * MiB, max_entries=100)
    assert isinstance(decision, Overflow)
    assert decision.reason.endswith(f"more than the whole budget of {10 * MiB:,}")


def test_the_entry_count_is_bounded_too() -> None:
    # room in bytes, but the store keeps at most 2 entries: the older idle one goes
    residents = [r("a", 1, last_used=1), r("b", 1, last_used=2)]
    assert make_room(residents, MiB, 10 * MiB, max_entries=2) == Admit(("a",), 2 * MiB)
    held = [r("a", 1, refs=1), r("b", 1, refs=1)]
    decision = make_room(held, MiB, 10 * MiB, max_entries=2)
    assert isinstance(decision, Overflow)
    assert decision.reason == "live replicas hold 2 entries, the most the store keeps"
