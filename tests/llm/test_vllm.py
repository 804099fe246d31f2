"""surge's OpenAI app on vLLM (the CPU build) with a tiny random Llama made here, run
from a Ray Serve LLM config file by `surge run`, unchanged, and spoken to with the
official `openai` client. Needs the LLM environment (`make llm-env`); skipped elsewhere.

One instance serves the module (vLLM takes ~30-80 s to start here). Outputs of a random
model are noise, so the checks are on shapes, counts and statuses; `ignore_eos` (vLLM's
extra parameter) makes lengths exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.eventually import eventually
from tests.llm.serving import START_TIMEOUT_S, Served, serve_script
from tests.ports import free_port

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

MODEL_CACHE = Path.home() / ".cache" / "surge-tests" / "tiny-llama-v2"  # v2: 4,096 positions
# The module's instance starts within a test's time (pytest-timeout counts fixtures).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(START_TIMEOUT_S + 120)]
ENGINE_KWARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048,
                 "max_num_seqs": 16, "kv_cache_memory_bytes": 128 * 1024 * 1024,
                 "enable_lora": True, "max_lora_rank": 8, "max_loras": 2}

CONFIG = """\
# A Ray Serve LLM config file: `serve run` takes it as is, and so does `surge run`.
http_options:
  host: 127.0.0.1
  port: {port}
applications:
- name: llm_app
  route_prefix: /
  import_path: ray.serve.llm:build_openai_app
  args:
    llm_configs:
    - model_loading_config:
        model_id: tiny
        model_source: {model}
      engine_kwargs: {engine_kwargs}
      lora_config:
        dynamic_lora_loading_path: file://{adapters}
        max_num_adapters_per_replica: 2
      deployment_config:
        autoscaling_config:
          min_replicas: 1
          max_replicas: 1
"""


def tiny_model() -> Path:
    from surge.testing.tiny_llm import make_tiny_llama

    return make_tiny_llama(MODEL_CACHE)


def tiny_adapters(directory: Path, base: Path) -> Path:
    """A directory of LoRA adapters (Ray's dynamic_lora_loading_path): `shout`, `hum` and
    `sing` (three, for a replica that holds two)."""
    from surge.testing.tiny_llm import make_tiny_lora

    for seed, name in enumerate(("shout", "hum", "sing"), start=1):
        make_tiny_lora(directory / name, base, seed=seed)
    return directory


def serve_config(config: Path, log: Path, port: int) -> Served:
    return serve_script(["-m", "surge.cli.main", "run", str(config)], log, port)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("vllm")
    port = free_port()
    config = directory / "config.yaml"
    model = tiny_model()
    adapters = tiny_adapters(directory / "adapters", model)
    config.write_text(CONFIG.format(port=port, model=model, adapters=adapters,
                                    engine_kwargs=ENGINE_KWARGS).replace("True", "true"))
    running = serve_config(config, directory / "surge.log", port)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(served: Served) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0,
                         timeout=60) as client:
        yield client


USER = [{"role": "user", "content": "Hello, how are you?"}]


def test_models(client: Any) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_chat(client: Any) -> None:
    chat = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8,
                                          temperature=0, extra_body={"ignore_eos": True})
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 8 and chat.usage.prompt_tokens > 0


def test_chat_streaming_with_usage(client: Any) -> None:
    chunks = list(client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=12, stream=True, temperature=0,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}


def test_completions(client: Any) -> None:
    done = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=5,
                                     extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 5
    parts = list(client.completions.create(model="tiny", prompt="Hello", max_tokens=4,
                                           stream=True, extra_body={"ignore_eos": True}))
    assert parts[-1].choices[0].finish_reason == "length"


def test_errors(client: Any) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="big", messages=USER)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=USER, top_p=2)
    assert bad.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=3000)
    assert "maximum context length is 2048" in long.value.body["message"]


def test_async_client_concurrent_streams(served: Served) -> None:
    async def go() -> list[int]:
        client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)

        async def one() -> int:
            stream = await client.chat.completions.create(
                model="tiny", messages=USER, max_tokens=16, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            chunks = [c async for c in stream]
            return int(chunks[-1].usage.completion_tokens)

        try:
            return await asyncio.gather(*(one() for _ in range(8)))
        finally:
            await client.close()

    assert asyncio.run(go()) == [16] * 8


def test_disconnect_aborts_the_engine_request(client: Any, served: Served,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from surge import serve
    from surge.api.instance import disconnect

    # This process joins the served instance as a driver for the handle; it leaves it
    # after, so a later module's serve.start makes its own instead of reusing this one.
    monkeypatch.setenv("SURGE_ADDRESS", served.control)
    try:
        _disconnect_aborts(client, serve)
    finally:
        disconnect(shutdown=False)


def _disconnect_aborts(client: Any, serve: Any) -> None:

    handle = serve.get_deployment_handle("LLMServer:tiny", "llm_app")

    def stats() -> dict[str, Any]:
        return dict(handle.record_routing_stats.remote().result(timeout_s=10))

    before = stats()["aborted"]
    # 2,000 tokens take the engine ~18 s here: a client that a loaded machine leaves
    # unscheduled for seconds (seen in CI: 230 tokens were all made before it read the
    # first) still goes away mid-way.
    stream = client.chat.completions.create(model="tiny", messages=USER, max_tokens=2000,
                                            stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()  # the client goes away after its first token
    eventually(lambda: stats()["aborted"] == before + 1, 20, interval_s=0.1,
               what="the engine request to be aborted")
    eventually(lambda: stats()["running"] == 0, 20, interval_s=0.2, what="a free engine")


def test_lora_adapter_loads_on_first_use(client: Any) -> None:
    def say(model: str) -> Any:
        return client.chat.completions.create(model=model, messages=USER, max_tokens=12,
                                              temperature=0, extra_body={"ignore_eos": True})

    base, adapted = say("tiny"), say("tiny:shout")
    assert adapted.model == "tiny:shout" and adapted.usage.completion_tokens == 12
    # The same greedy prompt says something else through the adapter: it is applied.
    assert adapted.choices[0].message.content != base.choices[0].message.content
    assert say("tiny:shout").choices[0].message.content == adapted.choices[0].message.content
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny", "tiny:shout"]
    assert client.models.retrieve("tiny:shout").parent == "tiny"
    with pytest.raises(openai.NotFoundError) as missing:
        say("tiny:whisper")
    assert missing.value.body["code"] == "model_not_found"
    # Two adapters per replica (max_num_adapters_per_replica): a third unloads the least
    # recently used one from vLLM (remove_lora); asked again, it loads again, the same.
    hum = say("tiny:hum").choices[0].message.content
    say("tiny:sing")
    assert [m.id for m in client.models.list()] == ["tiny", "tiny:hum", "tiny:sing"]
    assert say("tiny:shout").choices[0].message.content == adapted.choices[0].message.content
    assert say("tiny:hum").choices[0].message.content == hum
