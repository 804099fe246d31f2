"""Prompt chunks, the prefix index and the choice by longest held prefix."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator

from surge.policy.engine_routing import NO_REPLICA
from surge.policy.prefix_index import (
    CHUNK_BYTES,
    FINE_BYTES,
    GROWTH,
    MAX_PROMPT_BYTES,
    MAX_PROMPT_CHUNKS,
    WIDE_HOLDERS,
    WIDE_RUN,
    WIDE_SAMPLE,
    PrefixIndex,
    choose_by_prefix,
    chunk_end,
    chunk_names,
    holders,
    prompt_stream,
    read_holders,
    run_of_holders,
    sample_holders,
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


def test_a_name_is_sha1_of_the_parents_name_and_the_chunk() -> None:
    stream = bytes(range(256)) * 3
    first = hashlib.sha1(stream[:256]).digest()[:8]
    second = hashlib.sha1(first + stream[256:512]).digest()[:8]
    assert chunk_names(stream)[:2] == [int.from_bytes(first, "big"),
                                       int.from_bytes(second, "big")]


def test_chunks_grow_by_an_eighth_past_the_first_fine_bytes() -> None:
    # (chunk, where it ends): CHUNK_BYTES up to FINE_BYTES, then 1/8 of the bytes before
    # it in whole CHUNK_BYTES
    table = [(0, 256), (1, 512), (15, 4096), (16, 4608), (17, 5120), (18, 5632),
             (19, 6144), (20, 6912), (21, 7680), (22, 8448), (23, 9472)]
    assert [(k, chunk_end(k)) for k, _ in table] == table
    assert FINE_BYTES == 16 * CHUNK_BYTES and GROWTH == 8
    for k in range(FINE_BYTES // CHUNK_BYTES, MAX_PROMPT_CHUNKS):
        step = chunk_end(k) - chunk_end(k - 1)
        assert step % CHUNK_BYTES == 0 and step == chunk_end(k - 1) // GROWTH // CHUNK_BYTES \
            * CHUNK_BYTES
    # the bound: the last chunk ends within 1 MiB, the next would end past it
    last = chunk_end(MAX_PROMPT_CHUNKS - 1)
    assert last <= MAX_PROMPT_BYTES < last + last // GROWTH // CHUNK_BYTES * CHUNK_BYTES


def test_a_long_prompt_has_few_chunks_and_its_prefixes_keep_their_names() -> None:
    long = bytes(range(256)) * 880  # 220 KB
    names = chunk_names(long)
    # (stream bytes, full chunks): a partial chunk does not count
    table = [(255, 0), (256, 1), (4095, 15), (4096, 16), (4607, 16), (4608, 17),
             (100_000, 44), (len(long), 51)]
    for size, count in table:
        assert len(chunk_names(long[:size])) == count, size
        assert chunk_names(long[:size]) == names[:count]
    assert len(set(names)) == len(names)
    changed = bytearray(long)
    changed[150_000] ^= 1  # in chunk 48 (148,992-167,424): the names before it stay
    other = chunk_names(bytes(changed))
    assert other[:48] == names[:48] and not set(other[48:]) & set(names)
    huge = long * 6  # 1.3 MB: named up to the bound
    assert chunk_names(huge) == chunk_names(huge[:MAX_PROMPT_BYTES])
    assert len(chunk_names(huge)) == MAX_PROMPT_CHUNKS
    assert len(chunk_names(huge, max_chunks=1000)) == MAX_PROMPT_CHUNKS


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

    def reading(depth: int, indices: list[int]) -> tuple[int, Iterator[int]]:
        def each() -> Iterator[int]:
            for index in indices:
                read.append(index)
                yield index
        return depth, each()

    held = [reading(9, [0]), reading(5, [1, 2]), reading(1, [3])]
    assert choose_by_prefix([0, 0, 0, 0], [0, 0, 0, 0], 10, held, rng) == 0
    assert read == [0]


def test_a_full_replica_is_never_chosen_for_its_prefix() -> None:
    rng = random.Random(2)
    assert choose_by_prefix([4, 0], [1, 1], 4, [(9, [0])], rng) == 1  # in-flight full
    assert choose_by_prefix([0, 0], [4, 1], 4, [(9, [0])], rng) == 1  # its engine full
    assert choose_by_prefix([0, 0], [1, 1], 4, [(9, [5])], rng) in (0, 1)  # not routable


def wide(held_by: int, routable: list[str]) -> tuple[PrefixIndex, int, dict[str, int]]:
    """An index where r0 .. r{held_by - 1} hold chunk 1: (it, their mask, positions)."""
    index = PrefixIndex()
    for i in range(held_by):
        index.record(f"r{i}", [1])
    [(_, mask)] = index.held([1])
    return index, mask, {r: i for i, r in enumerate(routable)}


def test_a_depth_few_replicas_hold_is_read_whole() -> None:
    routable = [f"r{i}" for i in range(40)][::-1]  # positions: r39 first
    index, mask, at = wide(WIDE_HOLDERS, routable)
    read = list(read_holders(index, [(1, mask)], at, random.Random(1)))
    assert read == [(1, [39 - i for i in range(16)])]
    assert holders(index, mask, {r: at[r] for r in routable[:30]}) == [
        39 - i for i in range(10, 16)]  # the routable ones


def test_a_wide_depth_is_read_on_a_sample_then_a_run_then_whole() -> None:
    routable = [f"r{i}" for i in range(40)] + ["new"]  # `new` holds nothing yet
    index, mask, at = wide(30, routable)
    for seed in range(50):
        (d1, sample), (d2, run), (d3, whole) = read_holders(
            index, [(1, mask)], at, random.Random(seed))
        assert d1 == d2 == d3 == 1
        assert len(sample) == len(set(sample)) == WIDE_SAMPLE, seed  # found in 8 probes
        assert len(run) == len(set(run)) == WIDE_RUN, seed
        assert all(position < 30 for position in sample + run), seed  # holders only
        assert whole == list(range(30))
    # a run from a random bit wraps around to the lowest: consecutive holders, 8 of them
    runs = {tuple(run_of_holders(index, mask, at, random.Random(seed))) for seed in range(200)}
    assert {tuple(sorted(r)) for r in runs} >= {(0, 1, 2, 3, 4, 5, 6, 7),
                                                  (0, 1, 2, 3, 4, 5, 6, 29)}
    assert all(sorted(r) == sorted({(r[0] + k) % 30 for k in range(8)}) for r in runs)
    # holders that are not routable are never sampled; none routable: no sample read
    few_at = {"r7": 0, "r8": 1, "new": 2}
    for seed in range(50):
        assert set(sample_holders(index, mask, few_at, random.Random(seed))) <= {0, 1}
        assert sorted(run_of_holders(index, mask, few_at, random.Random(seed))) == [0, 1]
    assert list(read_holders(index, [(1, mask)], {"new": 0}, random.Random(2))) == [
        (1, []), (1, [])]


def recorded(pairs: Iterator[tuple[int, list[int]]], read: list[list[int]]
             ) -> Iterator[tuple[int, list[int]]]:
    """The pairs, each one's replicas added to `read` as choose_by_prefix takes it."""
    for depth, indices in pairs:
        read.append(indices)
        yield depth, indices


def test_a_large_minority_with_room_is_found_on_the_sample() -> None:
    routable = [f"r{i}" for i in range(512)]
    index, mask, at = wide(128, routable)  # a quarter of the replicas hold it
    in_flight = [1] * 512  # all with room, equal scores
    for seed in range(50):
        rng, read = random.Random(seed), []
        pairs = recorded(read_holders(index, [(1, mask)], at, rng), read)
        choice = choose_by_prefix(in_flight, in_flight, 8, pairs, rng)
        assert len(read) == 1 and len(read[0]) == WIDE_SAMPLE, seed  # the sample only
        assert choice in read[0], seed


def test_when_the_sampled_holders_are_all_full_the_depth_is_read_whole() -> None:
    routable = [f"r{i}" for i in range(512)]
    for held_by in (24, 128, 300):  # a minority, a large minority, a majority
        index, mask, at = wide(held_by, routable)
        last = held_by - 1  # the only holder with room (capacity 8); the others idle
        in_flight = [8] * last + [0] * (512 - last)
        whole = 0
        for seed in range(50):
            rng, read = random.Random(seed), []
            pairs = recorded(read_holders(index, [(1, mask)], at, rng), read)
            assert choose_by_prefix(in_flight, in_flight, 8, pairs, rng) == last, seed
            # read on until it was found: in the sample, the run, or the whole depth
            assert last in read[-1] and all(last not in r for r in read[:-1]), seed
            whole += len(read) == 3 and len(read[-1]) == held_by
        assert whole > 25, held_by  # mostly the whole depth (the rest found it sampled)


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
