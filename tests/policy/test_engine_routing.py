"""policy.engine_routing: the engine's queue as the score, power of two choices on it,
rendezvous affinity within a slack, and the affinity key of a request."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.policy.engine_routing import (
    AFFINITY_PREFIX_BYTES,
    NO_REPLICA,
    affinity_key,
    choose_by_score,
    choose_with_affinity,
    engine_score,
    rendezvous,
    stale_after,
)
from tests.policy.test_routing import ScriptedRandom


@pytest.mark.parametrize(("queue", "since", "in_flight", "age", "period", "score"), [
    (5, 0, 1, 0.1, 0.25, 5),  # the engine's queue
    (5, 2, 3, 0.1, 0.25, 7),  # plus what this router sent since the report
    (5, -1, 0, 0.1, 0.25, 4),  # minus what was answered since
    (1, 0, 4, 0.1, 0.25, 4),  # never below this router's own in flight
    (-1, 3, 2, 0.0, 0.25, 2),  # no queue in the stats: in flight alone
    (9, 0, 2, 0.55, 0.25, 9),  # two periods old (plus slack): still counts
    (9, 0, 2, 0.56, 0.25, 2),  # older: ignored
    (9, 0, 2, 20.0, 10.0, 9),  # a 10 s period tolerates 20 s
])
def test_engine_score(queue: int, since: int, in_flight: int, age: float, period: float,
                      score: int) -> None:
    assert engine_score(queue, since, in_flight, age, period) == score


def test_stale_after_is_two_periods_and_a_little() -> None:
    assert stale_after(0.25) == pytest.approx(0.55)
    assert stale_after(10.0) == pytest.approx(20.05)


@pytest.mark.parametrize(("in_flight", "scores", "draws", "chosen", "why"), [
    ([0, 0], [3, 1], (0, 0), 1, "the shorter engine queue wins, not the in-flight tie"),
    ([0, 0], [1, 3], (1, 0), 0, "either order of the sample"),
    ([1, 0], [3, 3], (0, 0), 1, "equal queues: fewer in flight"),
    ([0, 0], [2, 2], (0, 0), 0, "all equal: the first sampled"),
    ([4, 0, 0], [0, 2, 3], (0, 0), 1, "the sample's winner is full: the other one"),
    ([4, 4, 0, 0], [0, 0, 3, 2], (0, 0), 3, "both sampled full: the lowest with room"),
    ([4, 4], [0, 0], (0, 0), NO_REPLICA, "all full"),
    ([0, 0, 0], [4, 1, 2], (0, 0), 1, "an engine holding capacity (other routers') is full"),
    ([0, 0, 0], [9, 4, 2], (0, 0), 2, "both sampled engines full: the lowest with room"),
    ([0, 0], [4, 7], (0, 0), NO_REPLICA, "every engine full: queue or refuse at once"),
])
def test_choose_by_score(in_flight: list[int], scores: list[int], draws: tuple[int, int],
                         chosen: int, why: str) -> None:
    assert choose_by_score(in_flight, scores, 4, ScriptedRandom(*draws)) == chosen, why


@pytest.mark.parametrize(("in_flight", "chosen"), [([0], 0), ([4], NO_REPLICA), ([], -1)])
def test_choose_by_score_with_one_or_none(in_flight: list[int], chosen: int) -> None:
    assert choose_by_score(in_flight, in_flight, 4, random.Random(0)) == chosen
    assert choose_by_score([0], [4], 4, random.Random(0)) == NO_REPLICA  # its engine is full


def test_local_replicas_first_then_any() -> None:
    # Replicas 0-1 are local; the remote one has the shortest queue but is not looked at.
    assert choose_by_score([0, 0, 0], [2, 3, 0], 4, ScriptedRandom(0, 0), local=2) == 0
    # Every local one full: the remote one.
    assert choose_by_score([4, 4, 0], [0, 0, 3], 4, ScriptedRandom(0, 0, 0, 0), local=2) == 2


@given(st.lists(st.integers(0, 6), min_size=1, max_size=8), st.data())
def test_never_a_full_replica(in_flight: list[int], data: st.DataObject) -> None:
    scores = data.draw(st.lists(st.integers(0, 50), min_size=len(in_flight),
                                max_size=len(in_flight)))
    index = choose_by_score(in_flight, scores, 6, random.Random(data.draw(st.integers())))
    if all(load >= 6 or score >= 6 for load, score in zip(in_flight, scores, strict=True)):
        assert index == NO_REPLICA
    else:
        assert in_flight[index] < 6 and scores[index] < 6


def test_load_spreads_by_queue() -> None:
    rng = random.Random(7)
    picks = Counter(choose_by_score([0, 0, 0], [0, 10, 20], 100, rng) for _ in range(3000))
    # Two of three replicas are sampled each time: the shortest queue wins whenever it
    # is sampled (2/3), the middle one otherwise, the longest never.
    assert picks[2] == 0
    assert 1800 < picks[0] < 2200


def test_rendezvous_is_stable_and_moves_only_the_departed_keys() -> None:
    ids = ["a-1", "b-2", "c-3", "d-4"]
    keys = [f"session-{i}".encode() for i in range(400)]
    before = {key: ids[rendezvous(key, ids)] for key in keys}
    assert before == {key: ids[rendezvous(key, ids)] for key in keys}  # deterministic
    assert set(Counter(before.values())) == set(ids)  # every replica gets keys
    assert max(Counter(before.values()).values()) < 160  # roughly evenly (100 each)
    smaller = ["a-1", "b-2", "d-4"]  # c-3 went away
    after = {key: smaller[rendezvous(key, smaller)] for key in keys}
    moved = [key for key in keys if before[key] != after[key]]
    assert all(before[key] == "c-3" for key in moved)
    assert rendezvous(b"x", []) == NO_REPLICA


@pytest.mark.parametrize(("in_flight", "scores", "preferred", "chosen", "why"), [
    ([0, 0, 0], [2, 0, 1], 0, 0, "within the minimum slack of 2: it sticks"),
    ([0, 0, 0], [3, 0, 1], 0, 1, "over least + 2: it spills to the power-of-two choice"),
    ([0, 0], [30, 20], 0, 0, "the slack grows with the load: 20 + 50%"),
    ([0, 0], [31, 20], 0, 1, "past it: spills"),
    ([40, 0], [0, 5], 0, 1, "the preferred replica is full: never sent there"),
    ([0, 40], [0, 9], 0, 0, "the least loaded is taken among replicas with room"),
    ([0, 0], [40, 0], 0, 1, "the preferred replica's engine is full: spills"),
    ([0, 0], [9, 0], -1, 1, "no preference: plain choice"),
])
def test_choose_with_affinity(in_flight: list[int], scores: list[int], preferred: int,
                              chosen: int, why: str) -> None:
    rng = ScriptedRandom(0, 0)
    assert choose_with_affinity(in_flight, scores, 40, preferred, rng) == chosen, why


def test_a_hot_key_spreads_once_its_replica_is_loaded() -> None:
    # One session sends 20 requests, none finishing: its replica takes them while within
    # the slack of the others, then they spill, so no replica ends over the slack.
    in_flight = [0, 0, 0]
    rng = random.Random(3)
    for _ in range(20):
        index = choose_with_affinity(in_flight, in_flight, 100, 1, rng)
        in_flight[index] += 1
    assert in_flight[1] > in_flight[0] and in_flight[1] > in_flight[2]
    assert in_flight[1] <= min(in_flight) + max(2, 0.5 * min(in_flight)) + 1


@pytest.mark.parametrize(("session", "path", "body", "key"), [
    ("abc", "/v1/chat/completions", b"x" * 2000, b"s:abc"),  # the session id wins
    ("abc", "", b"", b"s:abc"),  # a handle call's
    ("", "/v1/chat/completions", b"y" * 2000, b"p:" + b"y" * AFFINITY_PREFIX_BYTES),
    ("", "/llm/v1/completions", b"z" * AFFINITY_PREFIX_BYTES, b"p:" + b"z" * 1024),
    ("", "/v1/chat/completions", b"short", b""),  # too short to be worth a key
    ("", "/v1/embeddings", b"w" * 2000, b""),  # not a prompt route
    ("", "/other", b"w" * 2000, b""),
])
def test_affinity_key(session: str, path: str, body: bytes, key: bytes) -> None:
    assert affinity_key(session, path, body) == key


def test_affinity_key_prefix_off() -> None:
    assert affinity_key("", "/v1/completions", b"q" * 4096, prefix_bytes=0) == b""
