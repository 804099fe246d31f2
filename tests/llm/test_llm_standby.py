"""A standby LLM replica (mock engines): its engine started before it counts as ready,
it serves the moment the scale-up decision activates it, and the pool refills.

The engine takes ENGINE_START_S to start, so a replica that had to start its engine
after the decision could not answer within ACTIVATION_BOUND_S: the probe's quick first
token is the standby's own engine answering."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from surge import serve
from surge.llm.config import LLMConfig
from surge.llm.engine import ModelInfo
from surge.serve.llm import build_openai_app
from surge.testing.mock_vllm import MockVLLMEngine
from tests.e2e.conftest import Running, running_instance
from tests.eventually import eventually
from tests.llm.standby import chat, hold_then_probe, states

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ENGINE_START_S = 6.0
ACTIVATION_BOUND_S = 3.0  # measured: ~10-20 ms (bench/llm_standby.py)


class SlowStartEngine(MockVLLMEngine):
    """The mock engine with a model that takes ENGINE_START_S to load."""

    async def start(self) -> ModelInfo:
        await asyncio.sleep(ENGINE_START_S)
        return await super().start()


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance() as running:
        yield running


def test_a_standby_llm_replica_serves_at_activation_and_the_pool_refills(
        instance: Running) -> None:
    config = LLMConfig(model_loading_config={"model_id": "mock"},
                       llm_engine=f"{__name__}:SlowStartEngine",
                       engine_kwargs={"max_model_len": 16384},
                       deployment_config={"max_ongoing_requests": 1, "autoscaling_config": {
                           "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                           "standby_replicas": 1}})
    serve.run(build_openai_app({"llm_configs": [config]}), name="standby",
              route_prefix="/standby")
    eventually(lambda: sorted(states("standby").values()) == ["RUNNING", "STANDBY"],
               30, what="one RUNNING and one STANDBY replica")
    [standby] = [r for r, s in states("standby").items() if s == "STANDBY"]
    first_token_s, holding = asyncio.run(hold_then_probe(
        instance.url, "/standby/v1/chat/completions", chat("mock", 12_000), chat("mock", 3),
        30.0))
    # The one running replica's only slot was held: the standby answered the probe, with
    # the engine it had started before it was ready.
    assert holding
    assert first_token_s < ACTIVATION_BOUND_S < ENGINE_START_S
    assert states("standby")[standby] == "RUNNING"
    # The pool is refilled in the background: a new replica, ready, out of the routes.
    eventually(lambda: [r for r, s in states("standby").items()
                        if s == "STANDBY" and r != standby] != [],
               3 * ENGINE_START_S + 10, what="a new STANDBY replica")
    serve.delete("standby")
