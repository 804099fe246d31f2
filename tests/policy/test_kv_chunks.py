"""ChunkCoverage: the engine's KV events (from sim/kv_blocks.py's pool, as the mock engine
emits them) read against served prompts, in the routers' chunk names."""

from __future__ import annotations

import pytest

from surge.codecs.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, replay
from surge.policy.kv_chunks import PENDING_TAKES, ChunkCoverage, PrefixChange
from surge.policy.prefix_index import CHUNK_BYTES
from surge.sim.kv_blocks import BlockPool, prefix_hashes

pytestmark = pytest.mark.fast

BLOCK = 4


def computed(pool: BlockPool, token_ids: list[int], lora_id: int | None = None) -> list[int]:
    """The engine computes a prompt: its full blocks are filled (and cached)."""
    full = len(token_ids) // BLOCK
    pool.allocate(full)
    parent, hashes = None, []
    for i in range(full):
        parent = pool.fill(parent, token_ids[i * BLOCK:(i + 1) * BLOCK], lora_id)
        hashes.append(parent)
    return hashes


def test_a_served_prompt_is_held_as_far_as_its_blocks_are() -> None:
    pool, coverage = BlockPool(num_blocks=64, block_size=BLOCK), ChunkCoverage()
    tokens = list(range(32))  # 8 blocks
    computed(pool, tokens)
    replay(pool.take_events(), coverage)
    # 4 chunks over a stream of 4 x CHUNK_BYTES: chunk k ends at token 8 (k + 1)
    coverage.served([11, 12, 13, 14], 4 * CHUNK_BYTES, tokens)
    change = coverage.take()
    assert change == PrefixChange(stored=[[11, 12, 13, 14]])
    assert coverage.take() == PrefixChange() and not coverage.take()
    assert "blocks=8" in repr(coverage)


def test_chunks_past_the_blocks_held_are_not_claimed() -> None:
    pool, coverage = BlockPool(num_blocks=64, block_size=BLOCK), ChunkCoverage()
    tokens = list(range(30))  # 7 full blocks: tokens 0-27; 28 and 29 are a partial block
    computed(pool, tokens)
    replay(pool.take_events(), coverage)
    coverage.served([1, 2, 3], 3 * CHUNK_BYTES, tokens)  # chunks end at tokens 10, 20, 30
    assert coverage.take().stored == [[1, 2]]


def test_removed_blocks_forget_the_chunks_ending_on_them_and_clear_forgets_all() -> None:
    pool, coverage = BlockPool(num_blocks=8, block_size=BLOCK), ChunkCoverage()
    first = list(range(32))  # fills the pool's 8 blocks
    hashes = computed(pool, first)
    replay(pool.take_events(), coverage)
    coverage.served([1, 2], 2 * CHUNK_BYTES, first)  # chunks end in blocks 3 and 7
    assert coverage.take().stored == [[1, 2]]
    pool.free(hashes, 0)  # the request ends: its blocks stay cached, freed tail first
    computed(pool, list(range(100, 104)))  # one new block: the first freed (the tail) goes
    replay(pool.take_events(), coverage)
    assert coverage.take().removed == [2]  # block 7 ended chunk 2
    replay([BlockRemoved([hashes[3], hashes[7]])], coverage)  # hashes[7]: already gone
    assert coverage.take().removed == [1]
    coverage.served([1, 2], 2 * CHUNK_BYTES, first)
    assert coverage.take().stored == []  # its first block is gone: nothing held
    replay([AllBlocksCleared()], coverage)
    change = coverage.take()
    assert change.cleared and change.stored == [] and not coverage.blocks


def test_a_clear_drops_what_the_take_would_have_said_before_it() -> None:
    pool, coverage = BlockPool(num_blocks=16, block_size=BLOCK), ChunkCoverage()
    tokens = list(range(8))
    hashes = computed(pool, tokens)
    replay(pool.take_events(), coverage)
    coverage.served([5], CHUNK_BYTES, tokens)
    coverage.take()
    replay([BlockRemoved([hashes[1]]), AllBlocksCleared()], coverage)
    assert coverage.take() == PrefixChange(cleared=True)


def test_an_adapter_blocks_are_its_own() -> None:
    pool, coverage = BlockPool(num_blocks=64, block_size=BLOCK), ChunkCoverage()
    tokens = list(range(8))
    computed(pool, tokens, lora_id=3)
    replay(pool.take_events(), coverage)
    coverage.served([7], CHUNK_BYTES, tokens)  # the base model's: not held
    coverage.served([8], CHUNK_BYTES, tokens, lora_id=3)
    assert coverage.take().stored == [[8]]
    assert coverage.blocks[(None, (0, 1, 2, 3), 3)] == prefix_hashes(tokens, BLOCK, 3)[0]


def test_a_prompt_waits_for_its_events_a_few_takes_then_is_given_up() -> None:
    pool, coverage = BlockPool(num_blocks=64, block_size=BLOCK), ChunkCoverage()
    tokens = list(range(8))
    computed(pool, tokens)
    events = pool.take_events()
    coverage.served([9], CHUNK_BYTES, tokens)
    assert coverage.take().stored == []  # the events have not come yet
    replay(events, coverage)
    assert coverage.take().stored == [[9]]
    coverage.served([10], CHUNK_BYTES, [50, 51, 52, 53])  # never computed
    for _ in range(PENDING_TAKES):
        assert coverage.pending
        coverage.take()
    assert not coverage.pending


def test_repeats_in_one_take_are_one_chain_and_empty_prompts_are_ignored() -> None:
    pool, coverage = BlockPool(num_blocks=64, block_size=BLOCK), ChunkCoverage()
    tokens = list(range(16))
    computed(pool, tokens)
    replay(pool.take_events(), coverage)
    for _ in range(3):
        coverage.served([1, 2], 2 * CHUNK_BYTES, tokens)
    coverage.served([], CHUNK_BYTES, tokens)
    coverage.served([4], 0, tokens)
    coverage.served([4], CHUNK_BYTES, [])
    assert len(coverage.pending) == 3
    assert coverage.take().stored == [[1, 2]]


def test_a_stored_batch_of_several_blocks_is_read_as_a_chain() -> None:
    coverage = ChunkCoverage(max_pending=2)
    replay([BlockStored([10, 11], None, [1, 2, 3, 4, 5, 6, 7, 8], BLOCK, None)], coverage)
    assert coverage.blocks == {(None, (1, 2, 3, 4), None): 10, (10, (5, 6, 7, 8), None): 11}
    for name in (1, 2, 3):
        coverage.served([name], CHUNK_BYTES, [1, 2, 3, 4, 5, 6, 7, 8])
    assert [p.names for p in coverage.pending] == [[2], [3]]  # bounded: the oldest goes
    assert coverage.take().stored == [[2], [3]]


def test_nothing_resolves_before_the_engine_said_its_block_size() -> None:
    coverage = ChunkCoverage()
    coverage.served([1], CHUNK_BYTES, [1, 2, 3, 4])
    assert coverage.take().stored == [] and coverage.pending
