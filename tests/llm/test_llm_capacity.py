"""What LLMServer reports of what the replica measured of its engine's capacity (the
meter: policy/llm_capacity.py, tested in tests/policy), and shedding against the TTFT
objective, on the mock vLLM engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from surge.config import AutoscalingConfig
from surge.llm.config import LLMConfig
from surge.llm.protocol import OpenAIError
from surge.llm.server import LLMServer
from surge.llm.service import OpenAIService, objectives_of
from surge.replica.context import ReplicaContext, ReplicaID, set_replica_context
from surge.replica.stats_hooks import engine_report
from surge.testing import MockVLLMEngine
from tests.eventually import eventually_async


def test_engine_report_reads_the_measured_keys() -> None:
    report = engine_report({"engine_waiting": 2, "engine_running": 3, "kv_cache_usage": 0.3,
                            "prefill_backlog_tokens": 900, "prefill_tokens_per_s": 12_000,
                            "prompt_tokens": 300, "decode_step_s": 0.01,
                            "decode_s_per_seq": 0.0002}, "r-1", 0.25)
    assert (report.prefill_backlog_tokens, report.prefill_tokens_per_s, report.prompt_tokens,
            report.decode_step_s, report.decode_s_per_seq) == (900, 12_000, 300, 0.01, 0.0002)
    old = engine_report({"engine_waiting": 2}, "r-1", 0.25)  # an engine that measures none
    assert (old.prefill_backlog_tokens, old.prefill_tokens_per_s) == (0.0, 0.0)


MOCK = {"step_s": 0.002, "decode_s_per_seq": 0.0, "prefill_s_per_token": 0.0005,
        "max_num_batched_tokens": 64, "block_size": 16, "num_blocks": 4096,
        "max_model_len": 4096}


def mock_config(objectives: dict[str, Any] | None) -> LLMConfig:
    deployment = {"autoscaling_config": {"objectives": objectives}} if objectives else {}
    return LLMConfig(model_loading_config={"model_id": "mock"},
                     llm_engine="surge.testing:MockVLLMEngine", engine_kwargs=MOCK,
                     deployment_config=deployment)


def chat(words: int) -> bytes:
    """A prompt of its own (none of it in the prefix cache)."""
    chat.count += 1  # type: ignore[attr-defined]
    text = " ".join(f"w{chat.count}-{i}" for i in range(words))  # type: ignore[attr-defined]
    return json.dumps({"model": "mock", "max_tokens": 2,
                       "messages": [{"role": "user", "content": text}]}).encode()


chat.count = 0  # type: ignore[attr-defined]


def test_objectives_come_from_the_llm_configs_autoscaling_config() -> None:
    assert objectives_of(mock_config(None)) is None
    objectives = objectives_of(mock_config({"ttft_ms": 150}))
    assert objectives is not None and (objectives.ttft_s, objectives.shed) == (0.15, True)
    as_object = LLMConfig(model_loading_config={"model_id": "mock"},
                          llm_engine="surge.testing:MockVLLMEngine", engine_kwargs=MOCK,
                          deployment_config={"autoscaling_config": AutoscalingConfig(
                              objectives={"ttft_ms": 200})})
    objectives = objectives_of(as_object)
    assert objectives is not None and objectives.ttft_s == 0.2


def test_in_a_replica_the_objectives_are_its_deployments() -> None:
    """A config file or override_serve_options may change the deployment's objectives
    without touching the LLMConfig: the replica sheds against the deployment's (its
    spec's), the ones its controller sizes for."""
    context = ReplicaContext(ReplicaID("r1", "LLMServer:mock", "app"), None)
    try:
        set_replica_context(context, {"ttft_ms": 300, "shed": True})
        objectives = objectives_of(mock_config({"ttft_ms": 150}))
        assert objectives is not None and objectives.ttft_s == 0.3
        set_replica_context(context, None)  # the deployment states none: none
        assert objectives_of(mock_config({"ttft_ms": 150})) is None
    finally:
        set_replica_context(None)


def test_a_burst_past_the_ttft_objective_is_shed_with_429_and_retry_after() -> None:
    """Prefill at 2,000 tokens/s: 100-token prompts take 50 ms each. Once the replica has
    measured that, a request arriving behind 10 others (0.55 s predicted) misses a 150 ms
    TTFT objective: 429 rate_limit_exceeded with Retry-After, at once; the rest serve."""
    async def main() -> None:
        cfg = mock_config({"ttft_ms": 150})
        engine = MockVLLMEngine(cfg)
        svc = OpenAIService(cfg, engine, await engine.start())
        # measure: a few requests one after another
        for _ in range(3):
            run = await svc.prepare_chat(chat(100))
            await run.complete()
        measured = svc.capacity.report(svc.clock())
        assert 1_000 < measured["prefill_tokens_per_s"] < 2_500
        outcomes: list[Any] = []

        async def one() -> None:
            try:
                run = await svc.prepare_chat(chat(100))
            except OpenAIError as exc:
                outcomes.append(exc)
                return
            outcomes.append(await run.complete())

        await asyncio.gather(*(one() for _ in range(12)))
        shed = [o for o in outcomes if isinstance(o, OpenAIError)]
        served = [o for o in outcomes if not isinstance(o, OpenAIError)]
        assert shed and served and svc.shed == len(shed)
        assert {(e.status, e.type, e.code) for e in shed} == {
            (429, "rate_limit_error", "rate_limit_exceeded")}
        assert all(e.retry_after_s is not None and e.retry_after_s >= 1.0 for e in shed)
        # none is shed once the backlog has drained
        run = await svc.prepare_chat(chat(100))
        await run.complete()
        await engine.shutdown()

    asyncio.run(main())


def test_a_bad_request_gets_400_not_a_shed_while_the_replica_is_busy() -> None:
    """A request that can never succeed (a prompt past the context, max_tokens 0) is told
    so (400), not 429 "retry later", even while prompts wait for prefill: a client that
    honours Retry-After would retry it forever and add to the load it was shed for."""
    async def main() -> None:
        cfg = mock_config({"ttft_ms": 150})
        engine = MockVLLMEngine(cfg)
        svc = OpenAIService(cfg, engine, await engine.start())
        for _ in range(3):  # measure the prefill rate (the meter reads it at a report)
            await (await svc.prepare_chat(chat(100))).complete()
        assert svc.capacity.report(svc.clock())["prefill_tokens_per_s"] > 0
        busy = asyncio.create_task((await svc.prepare_chat(chat(3000))).complete())
        await eventually_async(lambda: svc.capacity.backlog_tokens > 0, 5.0,
                               what="a prompt waiting for prefill (~1.5 s of it)")
        with pytest.raises(OpenAIError) as shed:  # a servable request is shed ...
            await svc.prepare_chat(chat(300))
        assert shed.value.status == 429
        too_long = json.loads(chat(5000))
        no_tokens = {**json.loads(chat(10)), "max_tokens": 0}
        for body in (no_tokens, too_long):  # ... these are refused for what they are
            with pytest.raises(OpenAIError) as raised:
                await svc.prepare_chat(json.dumps(body).encode())
            assert raised.value.status == 400 and raised.value.retry_after_s is None
        assert svc.capacity.backlog_tokens > 0  # (still busy: they met the shed's check)
        await busy
        await engine.shutdown()

    asyncio.run(main())


def test_without_objectives_nothing_is_shed_and_the_server_reports_what_it_measured() -> None:
    async def main() -> None:
        server = LLMServer.sync_init(mock_config(None))
        await server.start()
        svc = server.service
        assert svc is not None

        async def one() -> None:
            run = await svc.prepare_chat(chat(100))
            await run.complete()

        await asyncio.gather(*(one() for _ in range(12)))
        assert svc.shed == 0
        stats = await server.record_autoscaling_stats()
        assert set(stats) >= {"engine_waiting", "engine_running", "kv_cache_usage",
                              "prefill_backlog_tokens", "prefill_tokens_per_s",
                              "prompt_tokens", "decode_step_s", "decode_s_per_seq"}
        assert stats["prefill_tokens_per_s"] > 0 and stats["prompt_tokens"] > 100
        await server.shutdown()

    asyncio.run(main())
