"""Prompt chunks, the prefix index and the choice by longest held prefix."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from surge.policy.engine_routing import NO_REPLICA
from surge.policy.prefix_index import (
    CHUNK_BYTES,
    COARSE_BYTES,
    FINE_BYTES,
    MAX_PROMPT_CHUNKS,
    PrefixIndex,
    choose_by_prefix,
    chunk_end,
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


def test_chunks_are_coarse_past_the_first_fine_bytes() -> None:
    assert [chunk_end(k) for k in (0, 1, FINE_BYTES // CHUNK_BYTES - 1)] == [
        CHUNK_BYTES, 2 * CHUNK_BYTES, FINE_BYTES]
    assert chunk_end(FINE_BYTES // CHUNK_BYTES) == FINE_BYTES + COARSE_BYTES
    long = bytes(range(256)) * 880  # 220 KB: 128 fine chunks, then 94 coarse ones
    names = chunk_names(long)
    assert len(names) == FINE_BYTES // CHUNK_BYTES + (len(long) - FINE_BYTES) // COARSE_BYTES
    assert chunk_names(long[:FINE_BYTES + COARSE_BYTES - 1]) == names[:FINE_BYTES // CHUNK_BYTES]
    assert chunk_end(MAX_PROMPT_CHUNKS - 1) == 1024 * 1024  # the bound: 1 MiB of prompt


# -- the index -----------------------------------------------------------------------


def test_the_index_says_how_long_a_prefix_each_replica_holds() -> None:
    index = PrefixIndex()
    names = list(range(100, 110))
    index.record("a", names[:6])
    index.record("b", names[:3])
    # the deepest held is 6: rungs 6, 5, 4, 3, 1 read a and b exactly
    assert index.matched(names) == {"a": 6, "b": 3}
    assert index.matched(names[:2]) == {"a": 2, "b": 2}
    assert index.matched(names[:1]) == {"a": 1, "b": 1}
    assert index.matched([999, *names]) == {}
    assert index.matched([]) == {}
    index.record("c", names)
    index.record("a", names[:6])  # again: the same bit
    # the deepest is 10: rungs 10, 8, 7, 5, 2, 1; a depth between two reads as the lower
    assert index.matched(names) == {"c": 10, "a": 5, "b": 2}
    assert repr(index) == "<PrefixIndex chunks=10/200000 replicas=3>"


def test_forgotten_chunks_and_dropped_replicas_are_not_held() -> None:
    index = PrefixIndex()
    names = [1, 2, 3, 4]
    index.record("a", names)
    index.record("b", names)
    index.forget("a", [3, 4])  # an engine evicts a sequence's tail first
    assert index.matched(names) == {"a": 2, "b": 4}
    index.forget("b", [4])
    assert index.matched(names) == {"a": 2, "b": 3} and 4 not in index.chunks
    index.forget("nobody", names)  # never recorded: nothing to do
    index.drop("a")
    index.drop("a")  # twice: nothing more
    assert index.matched(names) == {"b": 3}
    index.record("new", [1])  # takes a's freed bit, which holds nothing of a's
    assert index.matched(names) == {"b": 3, "new": 1}
    index.drop("b")
    assert index.matched(names) == {"new": 1} and list(index.chunks) == [1]
    holed = PrefixIndex()
    holed.record("x", list(range(1, 9)))
    holed.forget("x", [6])  # not a tail: the ladder reads past the hole
    assert holed.matched(list(range(1, 9))) == {"x": 8}


def test_the_index_is_bounded_and_forgets_tails_and_the_least_recently_used() -> None:
    index = PrefixIndex(max_chunks=4)
    index.record("a", [1, 2])
    index.record("b", [8, 7])
    assert list(index.chunks) == [2, 1, 7, 8]  # a prefix's head is its most recent
    index.matched([1, 2])  # a lookup is a use, head last
    assert list(index.chunks) == [7, 8, 2, 1]
    index.record("c", [9])
    assert list(index.chunks) == [8, 2, 1, 9]  # b's tail went first
    assert index.matched([8, 7]) == {"b": 1}
    index.record("d", [10, 11])
    assert list(index.chunks) == [9, 8, 11, 10] and index.matched([1, 2]) == {}


# -- the choice ----------------------------------------------------------------------


def deepest_first(held: dict[int, int]) -> list[tuple[int, list[int]]]:
    """{index: depth} as `held` pairs: (depth, indices), deepest first."""
    return [(d, [i for i, depth in held.items() if depth == d])
            for d in sorted(set(held.values()), reverse=True)]


def test_the_longest_held_prefix_wins_within_the_slack() -> None:
    rng = random.Random(1)
    in_flight = [0, 0, 0, 0]
    scores = [1, 3, 2, 9]
    for held, chosen in (({1: 5, 2: 8}, 2),
                         ({1: 8, 2: 8}, 2),  # a tie: the lower score
                         ({2: 8, 1: 8}, 2),
                         # 3 holds the most but is over any power-of-two choice (at most
                         # 3) + the slack of 2: it spills to the next depth
                         ({3: 20, 1: 2}, 1)):
        for _ in range(20):  # whichever two replicas power of two samples
            assert choose_by_prefix(in_flight, scores, 10, deepest_first(held), rng) == chosen
    assert choose_by_prefix([0, 1, 0, 0], [1, 2, 2, 9], 10, [(8, [1, 2])], rng) == 2


def test_the_holders_are_read_only_down_to_the_first_depth_with_one_in_the_slack() -> None:
    rng = random.Random(4)
    read: list[int] = []

    def holders(depth: int, indices: list[int]) -> tuple[int, Iterator[int]]:
        def each() -> Iterator[int]:
            for index in indices:
                read.append(index)
                yield index
        return depth, each()

    held = [holders(9, [0]), holders(5, [1, 2]), holders(1, [3])]
    assert choose_by_prefix([0, 0, 0, 0], [0, 0, 0, 0], 10, held, rng) == 0
    assert read == [0]


def test_a_full_replica_is_never_chosen_for_its_prefix() -> None:
    rng = random.Random(2)
    assert choose_by_prefix([4, 0], [1, 1], 4, [(9, [0])], rng) == 1  # in-flight full
    assert choose_by_prefix([0, 0], [4, 1], 4, [(9, [0])], rng) == 1  # its engine full
    assert choose_by_prefix([0, 0], [1, 1], 4, [(9, [5])], rng) in (0, 1)  # not routable


def test_without_a_held_prefix_it_is_power_of_two_on_the_score() -> None:
    rng = random.Random(3)
    assert choose_by_prefix([0, 0], [5, 1], 10, [], rng) == 1
    assert choose_by_prefix([2, 2], [2, 2], 2, [(3, [0])], rng) == NO_REPLICA  # all full


def test_the_index_follows_what_an_engine_reports() -> None:
    index = PrefixIndex()
    index.record("b", [1, 2, 3])
    index.follow("a", [[1, 2, 3, 4]], [], False)
    assert index.matched([1, 2, 3, 4]) == {"a": 4, "b": 3}
    index.follow("a", [[1, 2]], [3, 4], False)  # evicted its tail, then computed [1, 2]
    assert index.matched([1, 2, 3, 4]) == {"b": 3, "a": 2}
    index.follow("b", [[9]], [], True)  # cleared before it cached 9
    assert index.matched([1, 2, 3]) == {"a": 2} and index.matched([9]) == {"b": 1}
