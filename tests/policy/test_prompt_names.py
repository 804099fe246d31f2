"""Recent prompts' chunk names: the same names as hashing, fewer chunks hashed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from surge.policy.prefix_index import CHUNK_BYTES, MAX_PROMPT_BYTES, chunk_end, chunk_names
from surge.policy.prompt_names import DEFAULT_MAX_PROMPTS, PromptNames

SYSTEM = bytes(range(256)) * 20  # 5,120 bytes: 18 chunks (the 18th ends at 5,120)
TURN = b"".join(i.to_bytes(2, "big") for i in range(4000))  # 8 KB


def named(streams: list[bytes], max_prompts: int = DEFAULT_MAX_PROMPTS) -> list[tuple[int, int]]:
    """(hashed, reused) after each stream, each stream's names checked against hashing."""
    cache = PromptNames(max_prompts)
    out = []
    for stream in streams:
        assert cache.names(stream) == chunk_names(stream)
        out.append((cache.hashed, cache.reused))
    return out


def test_a_stream_reuses_the_full_chunks_it_shares_with_the_last_of_its_first_chunk() -> None:
    first = SYSTEM + TURN  # 13,120 bytes: 27 chunks (the 27th ends at 13,056)
    assert len(chunk_names(first)) == 27
    table = [
        # (what came before, the stream, (hashed, reused) after it)
        ([], first, (27, 0)),
        ([first], first, (27, 27)),  # the same body again: nothing hashed
        ([first], first + b"next turn" * 300, (27 + 1, 27)),  # a later turn: its tail
        ([first], first[:5000], (27, 17)),  # a shorter one: its 17 full chunks
        ([first], SYSTEM + TURN[::-1], (27 + 9, 18)),  # the same system prompt only
        ([first], b"\xff" + first[1:], (27 + 27, 0)),  # another first chunk: all hashed
        ([first], first[:CHUNK_BYTES - 1], (27, 0)),  # no full chunk: no name
    ]
    for before, stream, counts in table:
        assert named([*before, stream])[-1] == counts, counts


def test_the_last_stream_of_a_first_chunk_is_the_one_kept() -> None:
    a, b = SYSTEM + TURN, SYSTEM + TURN[::-1]
    # b replaced a: a's turn is hashed again, past the system prompt they share
    assert named([a, b, a]) == [(27, 0), (36, 18), (45, 36)]
    assert named([a, b, b]) == [(27, 0), (36, 18), (36, 45)]


def test_the_oldest_first_chunk_is_forgotten_past_max_prompts() -> None:
    a, b, c = (bytes([i]) + SYSTEM[1:] for i in range(3))  # 18 chunks each
    assert named([a, b, c, b, a], max_prompts=2) == [
        (18, 0), (36, 0), (54, 0), (54, 18), (72, 18)]  # a was forgotten for c
    cache = PromptNames(2)
    for stream in (a, b, c):
        cache.names(stream)
    assert repr(cache) == "<PromptNames prompts=2/2 hashed=54 reused=0>"


def test_a_prompt_past_the_bound_is_kept_only_as_far_as_it_was_named() -> None:
    huge = (SYSTEM + TURN) * 100  # 1.3 MB
    cache = PromptNames()
    names = cache.names(huge)
    assert names == chunk_names(huge) and len(names) == len(chunk_names(huge[:MAX_PROMPT_BYTES]))
    kept, kept_names = cache.recent[huge[:CHUNK_BYTES]]
    assert len(kept) == chunk_end(len(names) - 1) <= MAX_PROMPT_BYTES and kept_names == names
    assert cache.names(huge + b"more") == names and cache.reused == len(names)


pieces = st.sampled_from([SYSTEM, TURN, TURN[::-1], b"x" * 3000, SYSTEM[:300], b""])


@given(st.lists(st.lists(pieces, max_size=6).map(b"".join), max_size=12),
       st.integers(1, 4))
def test_names_are_always_chunk_names_whatever_came_before(streams: list[bytes],
                                                           max_prompts: int) -> None:
    counts = named(streams, max_prompts)  # (checks each stream's names)
    if counts:
        hashed, reused = counts[-1]
        assert hashed + reused == sum(len(chunk_names(s)) for s in streams)
