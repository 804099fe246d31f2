"""Prompt chunks, the prefix index and the choice by longest held prefix."""

from __future__ import annotations

import json
import random

from surge.policy.engine_routing import NO_REPLICA
from surge.policy.prefix_index import (
    CHUNK_BYTES,
    PrefixIndex,
    choose_by_prefix,
    chunk_names,
    prompt_stream,
)

SYSTEM = "You are a helpful shopping assistant. " * 40  # ~1.5 KB


def chat(*contents: str, model: str = "m", first: str = "model") -> bytes:
    messages = [{"role": "system" if i == 0 else "user", "content": c}
                for i, c in enumerate(contents)]
    body = {"model": model, "messages": messages, "max_tokens": 5}
    if first == "messages":  # the same request, its fields in another order
        body = {"max_tokens": 5, "messages": messages, "model": model}
    return json.dumps(body).encode()


# -- the prompt stream and its chunks ------------------------------------------------


def test_the_stream_is_the_prompt_whatever_the_bodys_field_order() -> None:
    a = prompt_stream(chat(SYSTEM, "hello"))
    assert a is not None and a == prompt_stream(chat(SYSTEM, "hello", first="messages"))
    assert a.startswith(b"m\x1esystem\x1f" + SYSTEM.encode())
    assert prompt_stream(chat(SYSTEM, "hello", model="other")) != a
    assert prompt_stream(chat(SYSTEM, "hello"), adapter="lora-1") != a  # its own blocks


def test_content_parts_and_completion_prompts_have_streams() -> None:
    parts = json.dumps({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "ab"}, {"type": "image_url"}, {"type": "text", "text": "c"}]}]})
    assert prompt_stream(parts.encode()) == b"m\x1euser\x1fabc\x1e"
    assert prompt_stream(b'{"model": "m", "prompt": "once upon"}') == b"m\x1eonce upon"
    assert prompt_stream(b'{"model": "m", "messages": [{"role": "user"}]}') == \
        b"m\x1euser\x1f\x1e"


def test_a_body_without_a_prompt_has_no_stream() -> None:
    for body in (b"", b"not json", b'{"model": 3}', b'{"model": "m"}',
                 b'{"model": "m", "prompt": ["a", "b"]}', b'{"model": "m", "prompt": ""}',
                 b"[1, 2]"):
        assert prompt_stream(body) is None, body


def test_chunks_are_chained_full_and_bounded() -> None:
    stream = bytes(range(256)) * 10  # 10 chunks
    names = chunk_names(stream + b"tail")
    assert len(names) == 10 and len(set(names)) == 10  # equal chunks, chained names
    assert chunk_names(stream) == names  # the partial tail does not count
    other = chunk_names(b"x" + stream[1:])
    assert not set(other) & set(names)  # a change at the start changes every name
    assert chunk_names(stream[:CHUNK_BYTES * 3] + b"y" * 700)[:3] == names[:3]
    assert len(chunk_names(stream, max_chunks=4)) == 4
    assert chunk_names(b"short") == []


# -- the index -----------------------------------------------------------------------


def test_the_index_says_how_long_a_prefix_each_replica_holds() -> None:
    index = PrefixIndex()
    names = list(range(100, 110))
    index.record("a", names[:6])
    index.record("b", names[:3])
    index.record("c", names[2:8])  # not from the start: never a match
    assert index.matched(names) == {"a": 6, "b": 3}
    assert index.matched(names[:2]) == {"a": 2, "b": 2}
    assert index.matched([999, *names]) == {}
    assert index.matched([]) == {}
    index.record("c", names)
    assert index.matched(names) == {"a": 6, "b": 3, "c": 10}
    assert repr(index) == "<PrefixIndex chunks=10/200000 replicas=3>"


def test_forgotten_chunks_and_dropped_replicas_are_not_held() -> None:
    index = PrefixIndex()
    names = [1, 2, 3, 4]
    index.record("a", names)
    index.record("b", names)
    index.forget("a", [3])
    assert index.matched(names) == {"a": 2, "b": 4}
    index.forget("b", [3, 4])
    assert index.matched(names) == {"a": 2, "b": 2} and 3 not in index.chunks
    index.forget("nobody", names)  # never recorded: nothing to do
    index.drop("a")
    index.drop("a")  # twice: nothing more
    assert index.matched(names) == {"b": 2}
    index.record("new", [1])  # takes a's freed bit, which holds nothing of a's
    assert index.matched(names) == {"b": 2, "new": 1}
    index.drop("b")
    assert index.matched(names) == {"new": 1} and list(index.chunks) == [1]


def test_the_index_is_bounded_and_forgets_the_least_recently_used() -> None:
    index = PrefixIndex(max_chunks=4)
    index.record("a", [1, 2])
    index.record("b", [7, 8])
    index.matched([1, 2])  # a lookup is a use: 1, 2 are now the most recent
    index.record("c", [9])
    assert list(index.chunks) == [8, 1, 2, 9]
    assert index.matched([7, 8]) == {}  # 7 is gone, so the prefix is


# -- the choice ----------------------------------------------------------------------


def test_the_longest_held_prefix_wins_within_the_slack() -> None:
    rng = random.Random(1)
    in_flight = [0, 0, 0, 0]
    scores = [1, 3, 2, 9]
    assert choose_by_prefix(in_flight, scores, 10, {1: 5, 2: 8}, rng) == 2
    assert choose_by_prefix(in_flight, scores, 10, {2: 8, 1: 5}, rng) == 2
    assert choose_by_prefix(in_flight, scores, 10, {1: 8, 2: 8}, rng) == 2  # tie: lower score
    assert choose_by_prefix([0, 1, 0, 0], [1, 2, 2, 9], 10, {1: 8, 2: 8}, rng) == 2
    # replica 3 holds the most but is over least (1) + max(2, 0.5) = 3: it spills
    assert choose_by_prefix(in_flight, scores, 10, {3: 20, 1: 2}, rng) == 1


def test_a_full_replica_is_never_chosen_for_its_prefix() -> None:
    rng = random.Random(2)
    assert choose_by_prefix([4, 0], [1, 1], 4, {0: 9}, rng) == 1  # its in-flight is full
    assert choose_by_prefix([0, 0], [4, 1], 4, {0: 9}, rng) == 1  # its engine is full
    assert choose_by_prefix([0, 0], [1, 1], 4, {5: 9}, rng) in (0, 1)  # not routable


def test_without_a_held_prefix_it_is_power_of_two_on_the_score() -> None:
    rng = random.Random(3)
    assert choose_by_prefix([0, 0], [5, 1], 10, {}, rng) == 1
    assert choose_by_prefix([2, 2], [2, 2], 2, {0: 3}, rng) == NO_REPLICA  # all full
