"""choose_replica: power of two choices on in-flight counts, never a full replica."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.policy.routing import NO_REPLICA, choose_replica


class ScriptedRandom(random.Random):
    """Returns the given randrange results in order, so a test picks the sampled pair."""

    def __init__(self, *draws: int) -> None:
        super().__init__(0)
        self.draws = list(draws)
        self.calls: list[int] = []

    def randrange(self, n: int) -> int:  # type: ignore[override]
        self.calls.append(n)
        return self.draws.pop(0)


class RecordingRandom(random.Random):
    """A seeded Random that remembers what randrange returned."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws: list[int] = []

    def randrange(self, n: int) -> int:  # type: ignore[override]
        value = super().randrange(n)
        self.draws.append(value)
        return value


@pytest.mark.parametrize(
    ("in_flight", "capacity", "draws", "expected"),
    [
        # no replicas, one replica with / without room: no sampling at all
        ([], 5, (), NO_REPLICA),
        ([4], 5, (), 0),
        ([5], 5, (), NO_REPLICA),
        ([9], 5, (), NO_REPLICA),
        # the less loaded of the sampled pair wins
        ([3, 1, 0], 5, (0, 0), 1),  # second draw 0 >= first 0 -> shifted to index 1
        ([3, 1, 0], 5, (2, 0), 2),  # pair (2, 0): index 2 is idle
        ([0, 1, 3], 5, (1, 1), 1),  # pair (1, 2): index 1 has 1 < 3
        # ties go to the first sampled
        ([2, 2, 2], 5, (2, 0), 2),
        ([2, 2, 2], 5, (1, 0), 1),
        # both sampled are full: the least loaded replica with room anywhere
        ([5, 5, 3, 1], 5, (0, 0), 3),
        ([5, 5, 4, 4], 5, (1, 0), 2),  # tie among the rest: the lowest index
        ([5, 9, 5], 5, (0, 1), NO_REPLICA),
        # capacity 0 means nobody has room
        ([0, 0], 0, (0, 0), NO_REPLICA),
    ],
)
def test_choice_table(in_flight: list[int], capacity: int, draws: tuple[int, ...],
                      expected: int) -> None:
    rng = ScriptedRandom(*draws)
    assert choose_replica(in_flight, capacity, rng) == expected
    assert rng.draws == []  # every scripted draw was used: exactly two for n >= 2
    n = len(in_flight)
    assert rng.calls == ([n, n - 1] if n >= 2 else [])


loads = st.lists(st.integers(min_value=0, max_value=12), max_size=12)
capacities = st.integers(min_value=0, max_value=10)
seeds = st.integers(min_value=0, max_value=2**32)


@given(loads, capacities, seeds)
def test_never_a_full_replica_and_none_only_when_all_full(
        in_flight: list[int], capacity: int, seed: int) -> None:
    index = choose_replica(in_flight, capacity, random.Random(seed))
    has_room = any(load < capacity for load in in_flight)
    assert (index == NO_REPLICA) == (not has_room)
    if index != NO_REPLICA:
        assert 0 <= index < len(in_flight)
        assert in_flight[index] < capacity


@given(loads.filter(lambda xs: len(xs) >= 2), capacities, seeds)
def test_less_loaded_of_two_distinct_samples_else_least_loaded_with_room(
        in_flight: list[int], capacity: int, seed: int) -> None:
    rng = RecordingRandom(seed)
    index = choose_replica(in_flight, capacity, rng)
    first, second = rng.draws
    if second >= first:  # the second draw is among the other n - 1: distinct
        second += 1
    pair_best = min(in_flight[first], in_flight[second])
    if pair_best < capacity:
        assert index in (first, second)
        assert in_flight[index] == pair_best
    else:
        with_room = [load for load in in_flight if load < capacity]
        expected = in_flight.index(min(with_room)) if with_room else NO_REPLICA
        assert index == expected


@given(loads, capacities, seeds)
def test_deterministic_for_a_seed(in_flight: list[int], capacity: int, seed: int) -> None:
    a, b = random.Random(seed), random.Random(seed)
    first = [choose_replica(in_flight, capacity, a) for _ in range(20)]
    second = [choose_replica(in_flight, capacity, b) for _ in range(20)]
    assert first == second


def test_idle_replicas_are_chosen_evenly() -> None:
    rng = random.Random(1234)
    counts = Counter(choose_replica([0, 0, 0, 0], 1, rng) for _ in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(800 < count < 1200 for count in counts.values()), counts


def test_accepts_any_sequence() -> None:
    # The router passes a lazy sequence (only __len__ and __getitem__), not a list.
    class Loads:
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> int:
            return (4, 4, 0)[index]

    assert choose_replica(Loads(), 4, ScriptedRandom(0, 0)) == 2


@pytest.mark.parametrize(
    ("in_flight", "local", "draws", "expected", "sampled"),
    [
        # no preference: local 0 (caller's node unknown) or every replica local
        ([3, 1, 0], 0, (2, 0), 2, [3, 2]),
        ([3, 1, 0], 3, (2, 0), 2, [3, 2]),
        # the two local replicas (indexes 0, 1) are sampled first; idle remote 2 is ignored
        ([3, 1, 0], 2, (0, 0), 1, [2, 1]),
        # one local replica with room: no sampling, it is taken
        ([4, 0, 0], 1, (), 0, []),
        # every local replica full: fall back to all (pair 2, 0 -> index 2)
        ([5, 5, 0, 1], 2, (0, 0, 2, 0), 2, [2, 1, 4, 3]),
        # one local replica, full: fall back to the remote ones
        ([5, 2, 1], 1, (1, 1), 2, [3, 2]),
        # nobody has room anywhere
        ([5, 5, 5], 1, (0, 0), NO_REPLICA, [3, 2]),
    ],
)
def test_local_replicas_first(in_flight: list[int], local: int, draws: tuple[int, ...],
                              expected: int, sampled: list[int]) -> None:
    rng = ScriptedRandom(*draws)
    assert choose_replica(in_flight, 5, rng, local=local) == expected
    assert rng.draws == []
    assert rng.calls == sampled


@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.integers(0, 12),
       st.integers(0, 2**32 - 1))
def test_locality_never_picks_full_and_prefers_local_room(in_flight: list[int], local: int,
                                                          seed: int) -> None:
    capacity = 5
    local = min(local, len(in_flight))
    index = choose_replica(in_flight, capacity, random.Random(seed), local=local)
    if index == NO_REPLICA:
        assert all(load >= capacity for load in in_flight)
        return
    assert in_flight[index] < capacity
    if 0 < local < len(in_flight) and any(load < capacity for load in in_flight[:local]):
        assert index < local
