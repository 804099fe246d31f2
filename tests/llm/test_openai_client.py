"""The OpenAI app in real surge processes, spoken to with the official `openai` client,
on the fake engine (no model): what a user's client sees, end to end through the proxy.
The same checks against vLLM on a real (tiny) model: tests/llm/test_vllm.py."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from surge.api.config_apply import import_application
from surge.serve.llm import LLMConfig, LLMServingArgs, build_openai_app
from tests.e2e.conftest import Running, running_instance
from tests.eventually import eventually

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.e2e

FAKE = "surge.testing:FakeLLMEngine"


def fake(model_id: str, **engine_kwargs: Any) -> dict[str, Any]:
    return {"model_loading_config": {"model_id": model_id}, "llm_engine": FAKE,
            "engine_kwargs": {"max_model_len": 256, **engine_kwargs}}


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance() as running:
        # A Ray Serve LLM config file's application, as `serve run` would build it.
        app = import_application("ray.serve.llm:build_openai_app",
                                 {"llm_configs": [fake("fake", token_delay_s=0.002)]})
        assert "ray.serve.llm" not in sys.modules  # surge's builder, not Ray's
        serve.run(app, name="llm", route_prefix="/")
        yield running


@pytest.fixture
def client(instance: Running) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{instance.url}/v1", api_key="x", max_retries=0) as client:
        yield client


def test_models(client: Any) -> None:
    assert [m.id for m in client.models.list()] == ["fake"]
    assert client.models.retrieve("fake").id == "fake"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_chat_and_completions(client: Any) -> None:
    chat = client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hello there"}], max_tokens=4)
    assert chat.choices[0].message.content == "t0 t1 t2 t3"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 4 and chat.usage.prompt_tokens == 4
    done = client.completions.create(model="fake", prompt="one two", max_tokens=2)
    assert done.choices[0].text == "t0 t1" and done.usage.prompt_tokens == 2


def test_model_may_be_omitted_with_one_model(instance: Running) -> None:
    answer = httpx.post(f"{instance.url}/v1/chat/completions", timeout=10, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert answer.status_code == 200 and answer.json()["model"] == "fake"


def test_streaming_with_usage(client: Any) -> None:
    stream = client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "t0 t1 t2 t3 t4"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    completion = list(client.completions.create(model="fake", prompt="x", max_tokens=3,
                                                stream=True))
    assert "".join(c.choices[0].text for c in completion) == "t0 t1 t2"


def test_errors_are_openai_errors(client: Any) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="other", messages=[{"role": "user",
                                                                  "content": "x"}])
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="fake", messages=[{"role": "user",
                                                                 "content": "x"}],
                                       temperature=7)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model="fake", messages=[{"role": "user",
                                                                 "content": "x"}],
                                       max_tokens=10_000)
    assert "maximum context length" in long.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="fake", input="not a pooling model")


def test_async_client_streams_concurrently(instance: Running) -> None:
    async def go() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{instance.url}/v1", api_key="x", max_retries=0)

        async def one(i: int) -> str:
            stream = await client.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": f"n{i}"}],
                max_tokens=3, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream])

        try:
            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            await client.close()

    assert asyncio.run(go()) == ["t0 t1 t2"] * 8


@pytest.fixture(scope="module")
def slow(instance: Running) -> Any:
    """A model that takes 0.5 s a token: a stream lasts seconds after its first token."""
    serve.run(build_openai_app({"llm_configs": [fake("slow", token_delay_s=0.5)]}),
              name="slow", route_prefix="/slow")
    yield serve.get_deployment_handle("LLMServer:slow", "slow")
    serve.delete("slow")


@pytest.fixture
def slow_client(instance: Running) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{instance.url}/slow/v1", api_key="x", max_retries=0) as client:
        yield client


def test_first_token_is_sent_while_the_engine_still_generates(slow_client: Any,
                                                              slow: Any) -> None:
    client = slow_client
    stream = client.chat.completions.create(
        model="slow", messages=[{"role": "user", "content": "x"}], max_tokens=20, stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    # The role chunk and the first token left together, before the other 19 tokens exist:
    # no batching window and no buffering between the engine and the client. (The load
    # is sampled every 0.5 s; the stream has ~10 s to go.)
    assert eventually(lambda: slow.record_routing_stats.remote().result()["running"], 5) == 1
    stream.close()


def test_disconnect_aborts_the_engine_request(slow_client: Any, slow: Any) -> None:
    client = slow_client
    before = slow.record_routing_stats.remote().result()["aborted"]
    stream = client.chat.completions.create(
        model="slow", messages=[{"role": "user", "content": "x"}], max_tokens=20, stream=True)
    next(iter(stream))
    stream.close()  # the client goes away after its first token (19 tokens, ~10 s, to go)
    eventually(lambda: slow.record_routing_stats.remote().result()["aborted"] == before + 1,
               10, what="the engine request to be aborted")
    eventually(lambda: slow.record_routing_stats.remote().result()["running"] == 0, 5,
               what="the engine's load, sampled every 0.5 s, to show it")


def test_several_models_behind_one_endpoint(instance: Running,
                                            request: pytest.FixtureRequest) -> None:
    serve.run(build_openai_app(LLMServingArgs(llm_configs=[
        LLMConfig(**fake("a")), fake("b", eos_after=1)])), name="two", route_prefix="/two")
    base = f"{instance.url}/two/v1"
    client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
    request.addfinalizer(client.close)
    assert sorted(m.id for m in client.models.list()) == ["a", "b"]
    one = client.chat.completions.create(model="b", messages=[{"role": "user",
                                                                "content": "x"}])
    assert one.choices[0].message.content == "t0"
    assert one.choices[0].finish_reason == "stop"
    streamed = list(client.chat.completions.create(
        model="a", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == "t0 t1"
    answer = httpx.post(f"{base}/chat/completions", timeout=10, json={
        "messages": [{"role": "user", "content": "x"}]})  # which model? two are served
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="c", messages=[{"role": "user",
                                                              "content": "x"}])
    embedded = httpx.post(f"{base}/embeddings", timeout=10, json={"model": "a", "input": "x"})
    assert embedded.status_code == 400  # from LLMServer:a itself: not a pooling model
    assert embedded.json()["error"]["message"]
    # The proxy read each body's model and sent it straight to that LLMServer: the
    # ingress replica forwarded nothing (it answered /v1/models, the 400 and the 404).
    ingress = serve.get_deployment_handle("OpenAiIngress", "two")
    assert ingress.ingress_stats.remote().result() == {"forwarded": 0}
    # A body over the bound streams through the proxy: the ingress forwards that one.
    long = httpx.post(f"{base}/completions", timeout=10, json={
        "model": "b", "prompt": "word " * 60_000, "max_tokens": 1})
    assert long.status_code == 400 and "maximum context length" in long.text
    assert ingress.ingress_stats.remote().result() == {"forwarded": 1}
    serve.delete("two")


@pytest.mark.parametrize("path", ["one hop", "through the ingress"])
def test_disconnect_in_a_several_model_app_aborts(instance: Running, path: str,
                                                  request: pytest.FixtureRequest) -> None:
    serve.run(build_openai_app({"llm_configs": [fake("m1"), fake("m2", token_delay_s=0.5)]}),
              name="pair", route_prefix="/pair")
    request.addfinalizer(lambda: serve.delete("pair"))
    handle = serve.get_deployment_handle("LLMServer:m2", "pair")
    ingress = serve.get_deployment_handle("OpenAiIngress", "pair")
    # One word of 300 KB is one token to the fake engine, and a body the proxy streams
    # instead of reading its model: the ingress takes it.
    content = "x" * 300_000 if path == "through the ingress" else "x"
    with openai.OpenAI(base_url=f"{instance.url}/pair/v1", api_key="x",
                       max_retries=0) as client:
        stream = client.chat.completions.create(
            model="m2", messages=[{"role": "user", "content": content}], max_tokens=20,
            stream=True)
        next(iter(stream))
        stream.close()  # the proxy cancels at the LLMServer, or the ingress its handle call
    eventually(lambda: handle.record_routing_stats.remote().result()["aborted"] == 1, 10,
               what="the engine request to be aborted")
    forwarded = ingress.ingress_stats.remote().result()["forwarded"]
    assert forwarded == (1 if path == "through the ingress" else 0)


def test_the_proxy_answers_overload_with_an_openai_error_body(instance: Running,
                                                              request: pytest.FixtureRequest
                                                              ) -> None:
    config = {**fake("busy", token_delay_s=0.5),
              # Under Ray's count bound a Retry-After is sent when configured, as in Ray
              "deployment_config": {"max_ongoing_requests": 1, "max_queued_requests": 0,
                                    "backpressure_config": {"retry_after_s": 2}}}
    serve.run(build_openai_app({"llm_configs": [config]}), name="busy", route_prefix="/busy")
    request.addfinalizer(lambda: serve.delete("busy"))
    with openai.OpenAI(base_url=f"{instance.url}/busy/v1", api_key="x",
                       max_retries=0) as client:
        stream = client.chat.completions.create(
            model="busy", messages=[{"role": "user", "content": "x"}], max_tokens=20,
            stream=True)
        next(iter(stream))  # the one slot is taken
        with pytest.raises(openai.InternalServerError) as full:
            client.chat.completions.create(model="busy", max_tokens=1,
                                           messages=[{"role": "user", "content": "y"}])
        stream.close()
    assert full.value.status_code == 503
    assert full.value.response.headers["retry-after"] == "2"
    assert full.value.body["code"] == "service_unavailable"
    assert full.value.body["type"] == "server_error" and full.value.body["message"]
