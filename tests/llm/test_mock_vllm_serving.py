"""The mock vLLM engine deployed as a user deploys vLLM, spoken to with the `openai`
client: a repeated conversation is answered from the engine's prefix cache, and the
usage says so as vLLM's does; with two replicas, every request after the first that
shares a system prompt goes where that prefix is held (router/engine_choice.py),
whatever its body's field order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from surge.serve.llm import LLMConfig, build_openai_app
from tests.e2e.conftest import Running, running_instance

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance() as running:
        config = LLMConfig(model_loading_config={"model_id": "mock"},
                           llm_engine="surge.testing:MockVLLMEngine",
                           engine_kwargs={"block_size": 4, "max_model_len": 512},
                           deployment_config={"num_replicas": 2})
        serve.run(build_openai_app({"llm_configs": [config]}), name="llm", route_prefix="/")
        yield running


def test_a_repeated_conversation_is_served_from_the_prefix_cache(instance: Running) -> None:
    messages = [{"role": "system", "content": "you are a shopping assistant " * 8},
                {"role": "user", "content": "which shoes are on sale tonight"}]
    with openai.OpenAI(base_url=f"{instance.url}/v1", api_key="x", max_retries=0) as client:
        first = client.chat.completions.create(model="mock", messages=messages, max_tokens=5)
        again = client.chat.completions.create(model="mock", messages=messages, max_tokens=5)
        stream = client.chat.completions.create(model="mock", messages=messages, max_tokens=3,
                                                stream=True)
        chunks: list[Any] = list(stream)
    assert first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == 5
    prompt = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details is None  # a cold cache
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert prompt - 4 <= cached < prompt  # every full block but the last token's
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).count("t") == 3


def test_requests_that_share_a_prompt_prefix_meet_on_one_replica(instance: Running) -> None:
    system = "Python helper for a large repository, answering briefly. " * 12
    bodies = [{"model": "mock", "max_tokens": 2,
               "messages": [{"role": "system", "content": system},
                            {"role": "user", "content": f"question number {i}"}]}
              for i in range(6)]
    cached = []
    with httpx.Client(base_url=instance.url, timeout=30) as client:
        for i, body in enumerate(bodies):
            if i % 2:  # the same request, its fields in another order
                body = {"messages": body["messages"], "max_tokens": 2, "model": "mock"}
            answer = client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            details = answer.json()["usage"].get("prompt_tokens_details") or {}
            cached.append(details.get("cached_tokens", 0))
    assert cached[0] == 0
    assert all(c >= 100 for c in cached[1:]), cached  # the system prompt, every time
