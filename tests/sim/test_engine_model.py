"""The mock engine's model: vLLM's KV blocks with a prefix cache, its scheduler's steps,
and the KV events in vLLM's wire shape."""

from __future__ import annotations

import msgspec
import pytest

from surge.codecs.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from surge.sim.engine_model import EngineModel, EngineTiming, StepOutput
from surge.sim.kv_blocks import BlockPool, block_hash, prefix_hashes

BS = 4  # tokens per block in these tests


def model(**timing: float) -> EngineModel:
    base = {"step_s": 0.01, "prefill_s_per_token": 0.001, "decode_s_per_seq": 0.002,
            "block_size": BS, "num_blocks": 64, "max_model_len": 256}
    return EngineModel(EngineTiming(**(base | timing)))  # type: ignore[arg-type]


def run(m: EngineModel) -> list[StepOutput]:
    steps = []
    while not m.idle:
        steps.append(m.step())
        assert len(steps) < 1000
    return steps


# -- blocks and hashes ---------------------------------------------------------------


def test_equal_prefixes_have_equal_hash_chains_and_an_adapter_has_its_own() -> None:
    a = prefix_hashes(list(range(10)), BS, None)
    assert len(a) == 2  # the last two tokens fill no block
    assert prefix_hashes([*range(8), 99, 98, 97, 96], BS, None)[:2] == a
    assert prefix_hashes([5, *range(1, 8)], BS, None)[1] != a[1]  # the chain carries it
    assert prefix_hashes(list(range(8)), BS, 1) != a
    assert a[1] == block_hash(a[0], [4, 5, 6, 7], None)
    assert all(0 <= h < 2**63 for h in a)


def test_the_hash_chain_is_the_one_vllm_events_carried_before() -> None:
    """Pinned names (computed at 66a60a2, before prefix_hashes packed its ids once): a
    change to either function that moves every name together is still seen."""
    assert prefix_hashes(list(range(8)), 4, 7) == [6947696851424131994, 1826401844080946432]
    assert prefix_hashes(tuple(range(9)), 4, None) == [546280712968851089,
                                                       8021188163245510653]
    assert block_hash(None, [0, 1, 2, 3], 7) == 6947696851424131994


def test_a_freed_sequence_stays_cached_and_its_tail_is_evicted_first() -> None:
    pool = BlockPool(num_blocks=3, block_size=BS)
    pool.allocate(3)
    h1 = pool.fill(None, [0, 1, 2, 3], None)
    h2 = pool.fill(h1, [4, 5, 6, 7], None)
    h3 = pool.fill(h2, [8, 9, 10, 11], None)
    stored = pool.take_events()
    assert stored == [BlockStored([h1], None, [0, 1, 2, 3], BS, None),
                      BlockStored([h2], h1, [4, 5, 6, 7], BS, None),
                      BlockStored([h3], h2, [8, 9, 10, 11], BS, None)]
    pool.free([h1, h2, h3], partial=0)
    assert pool.used == 0 and pool.cached_prefix([h1, h2, h3]) == 3
    assert pool.can_hold(3) and not pool.can_hold(4)
    pool.allocate(1)  # room only by eviction: the tail goes first
    assert pool.take_events() == [BlockRemoved([h3])]
    assert pool.cached_prefix([h1, h2, h3]) == 2
    pool.reuse([h1, h2])  # another sequence takes the prefix
    assert (pool.used, pool.usage()) == (3, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        pool.allocate(1)
    assert repr(pool) == "<BlockPool used=3/3 free_cached=0 evictions=1>"
    with pytest.raises(ValueError, match="at least 1"):
        BlockPool(num_blocks=0, block_size=BS)


def test_a_block_computed_twice_is_stored_once_and_shared() -> None:
    pool = BlockPool(num_blocks=4, block_size=BS)
    pool.allocate(2)
    first = pool.fill(None, [7, 7, 7, 7], None)
    again = pool.fill(None, [7, 7, 7, 7], None)  # a concurrent sequence computed it too
    assert first == again and pool.refs[first] == 2
    pool.allocate(1)
    assert pool.fill(None, [7, 7, 7, 7], None) == first and pool.refs[first] == 3
    pool.reuse([first])
    assert pool.refs[first] == 4
    pool.free([first], 0)
    pool.free([first], 0)
    assert len(pool.take_events()) == 1
    pool.free([first], 0)
    pool.free([first], 0)
    assert pool.used == 0 and pool.cached_prefix([first]) == 1


def test_kv_events_travel_in_vllms_wire_shape() -> None:
    batch = KVEventBatch(ts=12.5, events=[BlockStored([11], None, [1, 2], 2, None),
                                          BlockRemoved([11]), AllBlocksCleared()])
    raw = encode_batch(batch)
    # vLLM 0.32's publisher: the batch an array, each event a map tagged by `type`
    assert msgspec.msgpack.decode(raw) == [12.5, [
        {"type": "BlockStored", "block_hashes": [11], "parent_block_hash": None,
         "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": None,
         "lora_name": None},
        {"type": "BlockRemoved", "block_hashes": [11], "medium": None},
        {"type": "AllBlocksCleared"}], None]
    assert decode_batch(raw) == batch
    # what vLLM writes and surge does not use (extra keys, cache groups) is ignored
    theirs = msgspec.msgpack.encode([1.0, [
        {"type": "BlockRemoved", "block_hashes": [5], "medium": "CPU", "group_idx": 0},
        {"type": "BlockStored", "block_hashes": [6], "parent_block_hash": 5,
         "token_ids": [3, 4], "block_size": 2, "lora_id": 1, "medium": "CPU",
         "lora_name": "a", "extra_keys": [["a"]], "group_idx": 0}], 0])
    assert decode_batch(theirs) == KVEventBatch(1.0, [
        BlockRemoved([5], "CPU"), BlockStored([6], 5, [3, 4], 2, 1, "CPU", "a")], 0)
    with pytest.raises(msgspec.ValidationError):
        decode_batch(msgspec.msgpack.encode([1.0, [{"type": "Unknown"}]]))


# -- the scheduler -------------------------------------------------------------------


def test_the_event_buffer_tells_its_reader_of_batches_lost_to_its_bound() -> None:
    """What both engines (vLLM's and the mock) keep for their reader: past the bound the
    oldest go, and the next take begins with AllBlocksCleared, once."""
    from surge.codecs.kv_events import KVEventBuffer

    buffer = KVEventBuffer(2)
    buffer.keep(KVEventBatch(1.0, [BlockRemoved([7])]))
    buffer.keep(KVEventBatch(2.0, []))
    assert [b.ts for b in buffer.take()] == [1.0, 2.0] and len(buffer) == 0  # none lost
    for ts in (3.0, 4.0, 5.0):  # the eviction in 3.0 is lost
        buffer.keep(KVEventBatch(ts, [BlockRemoved([9])] if ts == 3.0 else []))
    taken = buffer.take()
    assert taken[0].events == [AllBlocksCleared()] and [b.ts for b in taken[1:]] == [4.0, 5.0]
    assert buffer.take() == []  # told once


def test_a_step_lasts_admit_s_longer_for_each_request_it_gives_a_first_token() -> None:
    m = model(admit_s=0.005, prefill_s_per_token=0.0)
    m.add("a", tuple(range(4)), max_tokens=2)
    m.add("b", tuple(range(100, 104)), max_tokens=1)
    first, second = run(m)
    assert first.first.keys() == {"a", "b"}
    assert first.duration_s == pytest.approx(0.01 + 2 * 0.005)  # both first tokens
    assert second.duration_s == pytest.approx(0.01 + 0.002)  # "a" decodes: no admission
    with pytest.raises(ValueError, match="admit_s must be a number >= 0"):
        EngineTiming(admit_s=-1)


def test_step_jitter_adds_an_exponential_extra_drawn_from_the_steps_index() -> None:
    def durations(**timing: float) -> list[float]:
        m = model(decode_s_per_seq=0.0, prefill_s_per_token=0.0, **timing)
        m.add("a", tuple(range(4)), max_tokens=200)
        return [s.duration_s for s in run(m)]

    plain = durations()
    assert set(plain) == {0.01}  # none by default: every step its step_s
    jittered = durations(step_jitter_s=0.002)
    assert jittered == durations(step_jitter_s=0.002)  # the same steps, the same extras
    extras = sorted(d - 0.01 for d in jittered)
    assert len(extras) == 200 and extras[0] > 0
    # an exponential with mean 2 ms: mean ~2 ms, median ~2 ln 2 = 1.39 ms, p90 ~4.6 ms
    assert sum(extras) / 200 == pytest.approx(0.002, rel=0.2)
    assert extras[100] == pytest.approx(0.002 * 0.693, rel=0.25)
    assert extras[180] == pytest.approx(0.002 * 2.303, rel=0.25)
    with pytest.raises(ValueError, match="step_jitter_s must be a number >= 0"):
        EngineTiming(step_jitter_s=-1)


def test_one_request_prefills_then_decodes_and_a_second_reuses_its_prefix() -> None:
    m = model()
    m.add("a", tuple(range(10)), max_tokens=3)
    steps = run(m)
    assert [s.duration_s for s in steps] == pytest.approx([0.01 + 0.010, 0.012, 0.012])
    assert steps[0].first == {"a": 0} and steps[0].prefill_tokens == 10
    assert [len(s.tokens) for s in steps] == [1, 1, 1] and steps[-1].finished == ["a"]
    assert [type(e) for e in m.take_events()] == [BlockStored, BlockStored, BlockStored]
    m.add("b", tuple(range(10)), max_tokens=1)
    (step,) = run(m)
    assert step.first == {"b": 8} and step.prefill_tokens == 2  # 2 blocks were cached
    assert step.duration_s == pytest.approx(0.01 + 0.002)
    assert (m.prefix_hits, m.prefix_queries, m.hit_rate()) == (8, 20, 0.4)
    assert (m.prompt_tokens, m.generation_tokens) == (20, 4)
    assert repr(m) == ("<EngineModel waiting=0 running=0 <BlockPool used=0/64 free_cached=3 "
                       "evictions=0> hits=8/20>")


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    m = model()
    m.add("a", tuple(range(8)), max_tokens=2)
    run(m)
    m.add("b", tuple(range(8)), max_tokens=1)
    (step,) = run(m)
    assert step.first == {"b": 4} and step.prefill_tokens == 4  # the last block again


def test_another_adapters_blocks_are_not_a_hit() -> None:
    m = model()
    m.add("a", tuple(range(12)), max_tokens=1, lora_id=1)
    run(m)
    m.add("b", tuple(range(12)), max_tokens=1, lora_id=2)
    assert run(m)[0].first == {"b": 0}


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_decodes() -> None:
    m = model(max_num_batched_tokens=8)
    m.add("short", (1, 2), max_tokens=5)
    first = m.step()
    assert first.tokens == [("short", first.tokens[0][1])]
    m.add("long", tuple(range(20)), max_tokens=1)
    steps = [m.step() for _ in range(3)]
    # each step: one decode of "short", then 7 tokens of the long prompt
    assert [(s.decoding, s.prefill_tokens) for s in steps] == [(1, 7), (1, 7), (1, 6)]
    assert [s.first for s in steps] == [{}, {}, {"long": 0}]
    assert steps[-1].finished == ["long"]


def test_max_num_seqs_bounds_the_running_batch() -> None:
    m = model(max_num_seqs=2)
    for name in "abc":
        m.add(name, (1, 2, 3), max_tokens=2)
    step = m.step()
    assert set(step.first) == {"a", "b"} and (len(m.running), len(m.waiting)) == (2, 1)
    step = m.step()
    assert step.finished == ["a", "b"]
    assert m.step().first == {"c": 0}  # c's prompt is a, b's: cached (its last block not)


def test_a_full_cache_preempts_the_latest_sequence_which_recomputes_later() -> None:
    m = model(num_blocks=4)
    m.add("a", (1, 2, 3), max_tokens=8)  # 11 tokens: 3 blocks of KV by the end
    m.add("b", (4, 5, 6), max_tokens=8)
    steps = run(m)
    preempted = [s.preempted for s in steps if s.preempted]
    assert preempted == [["b"]]
    assert m.preemptions == 1
    tokens = {"a": 0, "b": 0}
    for step in steps:
        for seq, _ in step.tokens:
            tokens[seq] += 1
    assert tokens == {"a": 8, "b": 8}  # nothing lost, nothing sampled twice
    firsts = [s.first for s in steps if s.first]
    assert firsts[0] == {"a": 0, "b": 0} and len(firsts) == 1
    assert [f for s in steps for f in s.finished] == ["a", "b"]
    assert m.blocks.used == 0


def test_the_newest_sequence_preempts_itself_when_it_is_the_one_short_of_a_block() -> None:
    m = model(num_blocks=3)
    m.add("a", (1,), max_tokens=5)
    m.add("b", (2,), max_tokens=5)
    steps = [m.step() for _ in range(5)]
    # the 5th step: a takes the last block for its 5th token's KV; b, short of one,
    # goes back to the queue and decodes nothing
    assert [s.preempted for s in steps] == [[], [], [], [], ["b"]]
    assert [seq for seq, _ in steps[-1].tokens] == ["a"]
    assert [s.id for s in m.waiting] == ["b"]
    rest = run(m)
    assert sum(1 for s in rest for seq, _ in s.tokens if seq == "b") == 1  # 4 before
    assert m.blocks.used == 0 and m.preemptions == 1


def test_abort_frees_a_running_or_waiting_sequence() -> None:
    m = model(max_num_seqs=1)
    m.add("a", tuple(range(9)), max_tokens=50)
    m.add("b", (1,), max_tokens=5)
    m.step()
    assert m.blocks.used == 3
    m.add("c", (1,), max_tokens=5)
    assert m.abort("c") and [s.id for s in m.waiting] == ["b"]  # waiting, a still runs
    assert m.abort("a") and m.blocks.used == 0
    assert m.abort("b") and not m.abort("nobody") and m.idle
    assert m.step().duration_s == 0.0


@pytest.mark.parametrize(("prompt", "max_tokens", "problem"), [
    (0, 1, "the prompt is empty"),
    (250, 10, "exceed the model's context of 256"),
    (200, 10, "more than the KV cache's 8 blocks"),
])
def test_a_request_that_can_never_run_is_refused(prompt: int, max_tokens: int,
                                                 problem: str) -> None:
    m = model(num_blocks=8, block_size=BS)
    with pytest.raises(ValueError, match=problem):
        m.add("x", tuple(range(prompt)), max_tokens)


def test_timing_is_checked() -> None:
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        EngineTiming(block_size=0)
    with pytest.raises(ValueError, match="step_s must be a number >= 0, got -1"):
        EngineTiming(step_s=-1)
    with pytest.raises(ValueError, match="request_s must be a number >= 0, got 'x'"):
        EngineTiming(request_s="x")  # type: ignore[arg-type]
