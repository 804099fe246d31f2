"""choose_for_model: a model's requests go to its holders while they have room, spread to
at most `max_copies` replicas when they do not, and never to a full replica."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from surge.policy.model_routing import FREE_SLOT, NO_REPLICA, ModelHeat, choose_for_model

CAPACITY = 4


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[int], list[bool], list[int], int]:
    n = draw(st.integers(1, 12))
    in_flight = draw(st.lists(st.integers(0, CAPACITY), min_size=n, max_size=n))
    holds = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    models = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    return in_flight, holds, models, draw(st.integers(0, 4))


@given(fleets(), st.booleans(), st.integers(0, 2**32))
def test_never_a_full_replica_and_holders_first(fleet: tuple[list[int], list[bool],
                                                             list[int], int],
                                                 fallback: bool, seed: int) -> None:
    in_flight, holds, models, max_copies = fleet
    choice = choose_for_model(in_flight, CAPACITY, holds, models, max_copies,
                              random.Random(seed), fallback)
    room = [i for i, load in enumerate(in_flight) if load < CAPACITY]
    holders_with_room = [i for i in room if holds[i]]
    if choice == NO_REPLICA:
        assert not holders_with_room
        assert not fallback or not room
        return
    assert in_flight[choice] < CAPACITY
    if holders_with_room:
        assert choice in holders_with_room  # affinity whenever a holder has room
    elif not holds[choice] and not fallback:
        assert max_copies == 0 or sum(holds) < max_copies  # copies stay bounded


def test_a_hot_model_spreads_to_the_least_packed_replica() -> None:
    # Replica 0 holds the model and is full; 1 holds three models, 2 holds one.
    choice = choose_for_model([4, 0, 1], CAPACITY, [True, False, False], [1, 3, 1],
                              max_copies=2, rng=random.Random(1))
    assert choice == 2


def test_copies_are_bounded_and_the_fallback_takes_any_room() -> None:
    args = ([4, 4, 0], CAPACITY, [True, True, False], [1, 1, 0])
    assert choose_for_model(*args, max_copies=2, rng=random.Random(1)) == NO_REPLICA
    assert choose_for_model(*args, max_copies=2, rng=random.Random(1), fallback=True) == 2
    assert choose_for_model(*args, max_copies=3, rng=random.Random(1)) == 2


def test_requests_stay_on_holders_with_room() -> None:
    rng = random.Random(7)
    picks = {choose_for_model([1, 0, 0, 1], CAPACITY, [True, False, False, True],
                              [2, 0, 0, 2], max_copies=0, rng=rng) for _ in range(200)}
    assert picks == {0, 3}


def test_a_new_model_goes_where_it_evicts_the_least_requested_model() -> None:
    rng = random.Random(3)
    # all full of models; replica 1's coldest model is asked for least
    choice = choose_for_model([0, 0, 0], CAPACITY, [False] * 3, [3, 3, 3], 0, rng,
                              coldest=[5.0, 0.5, 2.0])
    assert choice == 1
    # a free model slot beats any eviction
    choice = choose_for_model([0, 0, 0], CAPACITY, [False] * 3, [3, 2, 3], 0, rng,
                              coldest=[5.0, FREE_SLOT, 0.1])
    assert choice == 1


def test_model_heat_halves_and_stays_bounded() -> None:
    heat = ModelHeat(half_life_s=10.0, limit=4)
    for _ in range(4):
        heat.hit("a", 0.0)
    heat.hit("b", 0.0)
    assert heat.value("a", 10.0) == 2.0
    assert heat.coldest(["a", "b"], 10.0) == 0.5
    assert heat.coldest([], 10.0) == 0.0
    for model in "cdef":
        heat.hit(model, 10.0)
    assert len(heat) <= 4 and heat.value("a", 10.0) == 2.0  # the coldest were forgotten
