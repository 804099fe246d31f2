"""The mock vLLM engine: the LLMEngine protocol over the engine model, in real time."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from surge.codecs.kv_events import AllBlocksCleared, BlockStored
from surge.config.schema import FieldError
from surge.llm.config import LLMConfig
from surge.llm.engine import (
    AdapterError,
    Delta,
    EngineError,
    LLMEngine,
    Prompt,
    PromptTooLong,
    SamplingParams,
)
from surge.sim.engine_model import StepOutput
from surge.testing import MockVLLMEngine
from surge.testing.mock_vllm import MAX_LAG_S
from tests.eventually import eventually_async

T = TypeVar("T")

FAST = {"step_s": 0.001, "decode_s_per_seq": 0.0, "prefill_s_per_token": 0.0,
        "block_size": 4, "num_blocks": 64, "max_model_len": 128}


def engine(**kwargs: Any) -> MockVLLMEngine:
    config = LLMConfig(model_loading_config={"model_id": "mock"},
                       llm_engine="surge.testing:MockVLLMEngine",
                       engine_kwargs=FAST | kwargs)
    return MockVLLMEngine(config)


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())


def run_started(main: Callable[[MockVLLMEngine], Awaitable[None]], **kwargs: Any) -> None:
    """`main` on a started `engine(**kwargs)`, shut down after it."""
    async def started() -> None:
        e = engine(**kwargs)
        await e.start()
        try:
            await main(e)
        finally:
            await e.shutdown()

    run(started)


async def timed(work: Awaitable[T]) -> tuple[T, float]:
    """What `work` gives, and the seconds it took on the loop's clock."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await work
    return result, loop.time() - started


async def collect(e: MockVLLMEngine, words: str, max_tokens: int, rid: str,
                  adapter: str | None = None) -> list[Delta]:
    prompt = Prompt(text=words)
    return [d async for d in e.generate(prompt, SamplingParams(max_tokens=max_tokens), rid,
                                        adapter=adapter)]


def test_it_speaks_the_engine_protocol_and_streams_one_token_a_step() -> None:
    async def main() -> None:
        e = engine()
        assert isinstance(e, LLMEngine)
        info = await e.start()
        assert info.max_model_len == 128
        deltas = await collect(e, "a b c d e f", 3, "r1")
        assert [d.finish_reason for d in deltas] == [None, None, "length"]
        assert deltas[0].prompt_tokens == 6 and deltas[0].text.startswith("t")
        assert deltas[1].text.startswith(" t") and e.steps == 3
        await e.check_health()
        await e.shutdown()

    run(main)


def test_batches_lost_to_the_bound_are_told_as_a_cleared_cache() -> None:
    """A reader that fell behind lost the oldest batches (evictions among them): its
    next read starts with AllBlocksCleared, so no index keeps what the engine evicted."""
    async def main(e: MockVLLMEngine) -> None:
        for n in range(3):  # a batch each: more than the 2 kept
            await collect(e, " ".join(f"p{n}w{i}" for i in range(10)), 1, f"r{n}")
        batches = e.kv_events()
        assert batches[0].events == [AllBlocksCleared()]
        assert [type(ev) for b in batches[1:] for ev in b.events] == [BlockStored] * 4
        await collect(e, " ".join(f"p3w{i}" for i in range(10)), 1, "r3")
        assert AllBlocksCleared() not in [ev for b in e.kv_events() for ev in b.events]

    run_started(main, max_events=2)


def test_a_repeated_prefix_is_served_from_cache_and_published_as_vllm_does() -> None:
    async def main(e: MockVLLMEngine) -> None:
        prompt = " ".join(f"w{i}" for i in range(10))
        first = await collect(e, prompt, 1, "a")
        again = await collect(e, prompt, 1, "b")
        assert (first[0].cached_tokens, again[0].cached_tokens) == (0, 8)
        stats = e.stats()
        assert stats.prefix_cache_hit_rate == pytest.approx(8 / 20)
        assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (20, 8)  # as vLLM's
        assert (stats.running, stats.waiting, stats.kv_cache_usage) == (0, 0, 0.0)
        batches = e.kv_events()
        stored = [ev for b in batches for ev in b.events if isinstance(ev, BlockStored)]
        assert len(stored) == 2 and stored[1].parent_block_hash == stored[0].block_hashes[0]
        assert e.kv_events() == []  # taken

    run_started(main)


def test_steps_take_the_modelled_time_and_a_batch_shares_them() -> None:
    async def main(e: MockVLLMEngine) -> None:
        results, elapsed = await timed(
            asyncio.gather(*(collect(e, "x y z", 5, f"r{i}") for i in range(4))))
        assert all(len(r) == 5 for r in results)
        assert e.steps == 5  # four sequences decoded together
        assert elapsed >= 5 * 0.02

    run_started(main, step_s=0.02)


def test_the_loops_own_work_between_steps_does_not_add_to_them() -> None:
    """Other work holds the event loop 3 ms of every 7 (as a busy replica's would), so
    many of the engine's 5 ms steps wake late: a busy engine's next step still ends one
    modelled step after the last one's modelled end, not one after the late wake (unless
    the loop fell more than MAX_LAG_S behind, when the lost time is dropped). Read on the
    mock's own deadlines, not on a wall-clock bound a loaded host would break."""
    async def main(e: MockVLLMEngine) -> None:
        loop = asyncio.get_running_loop()
        busy = True
        # per step: its modelled end, its duration, when the loop computed the next one
        # from it (`now`) and when it woke at its end
        steps: list[tuple[float, float, float, float]] = []
        durations: list[tuple[float, float]] = []
        model_step, sleep_until = e.model.step, e._sleep_until

        def step() -> StepOutput:
            out = model_step()
            durations.append((out.duration_s, loop.time()))
            return out

        async def sleep(deadline: float) -> None:
            await sleep_until(deadline)
            if len(steps) < len(durations):  # the wait to a step's end (not an idle one)
                steps.append((deadline, *durations[len(steps)], loop.time()))

        e.model.step = step  # type: ignore[method-assign]
        e._sleep_until = sleep  # type: ignore[method-assign]

        async def other_work() -> None:  # on its own schedule (never in step with the
            at = loop.time()  # engine's, whose wakes it delays)
            while busy:
                at += 0.007
                await asyncio.sleep(max(0.0, at - loop.time()))
                time.sleep(0.003)

        other = asyncio.create_task(other_work())
        deltas = await collect(e, "x y z", 40, "r")
        busy = False
        await other
        assert len(deltas) == 40 and len(steps) == 40
        chained_after_late_wake = 0
        for (end, _, _, woke), (next_end, duration, now, _) in itertools.pairwise(steps):
            if now - MAX_LAG_S < end - 0.001:  # within the lag it makes up: chained
                assert next_end == pytest.approx(end + duration, abs=1e-9)
                chained_after_late_wake += woke - end > 0.001
            else:  # (about) MAX_LAG_S behind or more: the lost time is dropped
                assert next_end >= end + duration - 1e-9
        # late wakes happened, and the steps after them kept to the modelled schedule
        assert chained_after_late_wake >= 1

    run_started(main, step_s=0.005)


def test_a_request_waits_its_frontend_cost_without_delaying_the_steps() -> None:
    async def main(e: MockVLLMEngine) -> None:
        first, elapsed = await timed(collect(e, "x y z", 2, "r"))
        assert elapsed >= 0.05 and len(first) == 2
        assert e.steps == 2  # the wait was no step
        # cancelled while it waits: it never reaches the engine
        task = asyncio.create_task(collect(e, "x y", 2, "gone"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert e.model.idle and "gone" not in e._outputs

    run_started(main, step_s=0.001, request_s=0.05)


def test_abort_ends_the_stream_and_frees_the_cache() -> None:
    async def main(e: MockVLLMEngine) -> None:
        got: list[Delta] = []

        async def reader() -> None:
            async for delta in e.generate(Prompt(text="a b c d e"),
                                          SamplingParams(max_tokens=100), "long"):
                got.append(delta)

        task = asyncio.create_task(reader())
        await eventually_async(lambda: len(got) >= 2, 10, what="two tokens")
        await e.abort("long")
        await task
        assert got[-1].finish_reason == "abort" and e.model.idle
        assert e.stats().kv_cache_usage == 0.0

    run_started(main, step_s=0.005)


def test_a_new_requests_first_step_costs_admit_s_and_holds_up_the_batch() -> None:
    async def main(e: MockVLLMEngine) -> None:
        loop = asyncio.get_running_loop()
        stamps: list[float] = []

        async def running() -> None:
            prompt, params = Prompt(text="a b"), SamplingParams(max_tokens=30)
            async for _ in e.generate(prompt, params, "a"):
                stamps.append(loop.time())

        task = asyncio.create_task(running())
        await eventually_async(lambda: len(stamps) >= 3, 5.0)
        (_, took), before = await timed(collect(e, "c d", 1, "b")), len(stamps)
        await task
        assert took >= 0.05 and before < 30  # "b" came while "a" was decoding
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert sum(gap >= 0.05 for gap in gaps) >= 1  # "a" waited out "b"'s first step
        with pytest.raises(FieldError, match="admit_s"):
            engine(admit_s=-1)

    run_started(main, step_s=0.001, admit_s=0.05)


def test_a_request_aborted_in_its_frontend_wait_never_reaches_the_engine() -> None:
    async def main(e: MockVLLMEngine) -> None:
        task = asyncio.create_task(collect(e, "x y", 2, "early"))
        await asyncio.sleep(0.01)  # in its 50 ms frontend wait
        await e.abort("early")
        assert [d.finish_reason for d in await task] == ["abort"]
        served = await collect(e, "x y z", 1, "next")
        assert served[0].finish_reason == "length"
        assert (e.steps, e.stats().prefix_cache_queries) == (1, 3)  # "early" never ran

    run_started(main, step_s=0.001, request_s=0.05)


def test_a_reader_that_goes_away_aborts_its_request() -> None:
    async def main(e: MockVLLMEngine) -> None:
        stream = e.generate(Prompt(text="a b"), SamplingParams(max_tokens=100), "gone")
        await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
        assert e.model.idle

    run_started(main, step_s=0.005)


def test_bad_requests_get_the_engines_errors() -> None:
    async def main() -> None:
        e = engine()
        with pytest.raises(EngineError, match="not started"):
            await collect(e, "a", 1, "early")
        await e.start()
        with pytest.raises(PromptTooLong, match="context of 128"):
            await collect(e, "a " * 120, 20, "long")
        with pytest.raises(AdapterError):
            await collect(e, "a", 1, "x", adapter="nope")
        await e.load_adapter("mine", "/nowhere")
        a = await collect(e, "p q r s t", 1, "a1", adapter="mine")
        b = await collect(e, "p q r s t", 1, "b1")
        assert (a[0].cached_tokens, b[0].cached_tokens) == (0, 0)  # the adapter's own blocks
        # an unloaded adapter's id is never given to another (vLLM's lora_int_id rule): a
        # new adapter must not find the old one's blocks
        await e.load_adapter("other", "/nowhere")
        other = e.lora_id("other")
        await e.unload_adapter("other")
        await e.load_adapter("third", "/nowhere")
        assert e.lora_id("third") not in (other, e.lora_id("mine"))
        c = await collect(e, "p q r s t", 1, "c1", adapter="third")
        assert c[0].cached_tokens == 0
        await e.shutdown()
        with pytest.raises(EngineError, match="not running"):
            await e.check_health()

    run(main)


def test_the_service_tells_what_the_engine_holds_in_the_routers_chunk_names() -> None:
    import json

    from surge.llm.service import OpenAIService
    from surge.policy.prefix_index import chunk_names, prompt_stream

    async def main() -> None:
        config = LLMConfig(model_loading_config={"model_id": "mock"},
                           llm_engine="surge.testing:MockVLLMEngine",
                           engine_kwargs=FAST | {"max_model_len": 4096, "num_blocks": 96},
                           lora_config={"dynamic_lora_loading_path": "/nowhere"})
        e = MockVLLMEngine(config)
        service = OpenAIService(config, e, await e.start())

        async def chat(words: str, model: str = "mock") -> list[int]:
            body = json.dumps({"model": model, "max_tokens": 1, "stream": True,
                               "messages": [{"role": "user", "content": words}]}).encode()
            run = await service.prepare_chat(body)
            async for _ in run.stream():
                pass
            stream = prompt_stream(body)
            assert stream is not None
            return chunk_names(stream)

        shop = " ".join(f"shoe{i}" for i in range(120))  # ~830 bytes: 3 chunks
        names = await chat(shop)
        assert len(names) == 3
        change = service.prefix_change()
        assert change == {"stored": [names], "removed": [], "cleared": False}
        assert service.prefix_change() == {"stored": [], "removed": [], "cleared": False}
        # another prompt fills the cache: the first one's blocks are evicted, tail first
        await chat(" ".join(f"code{i}" for i in range(300)))
        change = service.prefix_change()
        assert change is not None and names[-1] in change["removed"]
        # an adapter's prompt is its own: named with the adapter, on its own blocks
        tuned = await chat(shop, model="mock:tuned")
        assert tuned != names and e.lora_id("tuned") is not None
        change = service.prefix_change()
        assert change is not None and change["stored"] == [tuned]
        await e.shutdown()

    run(main)
    # The adapters' model cache reports to this process's multiplexed models (a replica's,
    # by design) while it lives: collect it, or a later test's replica greets with it.
    gc.collect()


def test_an_engine_without_kv_events_reports_no_cache_change() -> None:
    from surge.llm.service import OpenAIService
    from surge.testing import FakeLLMEngine

    async def main() -> None:
        config = LLMConfig(model_loading_config={"model_id": "fake"},
                           llm_engine="surge.testing:FakeLLMEngine")
        fake = FakeLLMEngine(config)
        service = OpenAIService(config, fake, await fake.start())
        assert service.prefixes is None and service.prefix_change() is None

    run(main)


def test_words_are_tokens_by_a_stable_hash_and_the_ids_kept_are_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import surge.testing.llm as words

    # pinned: crc32 of each word mod 50,000, whatever whitespace parts them
    assert words.word_tokens("the red\tshoes\n é") == [33078, 35455, 43447, 29326]
    assert words.word_tokens("") == []
    monkeypatch.setattr(words, "_TOKEN_IDS", {})
    monkeypatch.setattr(words, "_MAX_TOKEN_IDS", 2)
    text = "a b c a d e a"
    fresh = [zlib.crc32(w.encode()) % 50_000 for w in text.split()]
    assert words.word_tokens(text) == fresh == words.word_tokens(text)  # known or not
    assert len(words._TOKEN_IDS) <= 2
