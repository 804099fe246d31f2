"""The OpenAI layer on the fake engine, in this process: decoding and checks, the SSE
stream's exact shape, usage, errors, aborts, configs and builders. No model, no vLLM."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from surge.api.deployment import build_app_spec, deployment
from surge.errors import ConfigError
from surge.llm.asgi import OpenAIApp
from surge.llm.builders import build_llm_deployment, build_openai_app, merge_options
from surge.llm.config import LLMConfig, LLMServingArgs
from surge.llm.ingress import OpenAiIngress
from surge.llm.protocol import ChatCompletionRequest, OpenAIError, decode, model_of
from surge.llm.server import LLMServer
from surge.llm.service import OpenAIService
from surge.model import ModelRoutes
from surge.testing import FakeLLMEngine
from tests.eventually import eventually_async

FAKE = "surge.testing:FakeLLMEngine"


def config(**engine_kwargs: Any) -> LLMConfig:
    return LLMConfig(model_loading_config={"model_id": "fake"}, llm_engine=FAKE,
                     engine_kwargs={"max_model_len": 64, **engine_kwargs})


async def service(**engine_kwargs: Any) -> OpenAIService:
    cfg = config(**engine_kwargs)
    engine = FakeLLMEngine(cfg)
    return OpenAIService(cfg, engine, await engine.start())


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                       **fields}).encode()


def events(raw: bytes) -> list[Any]:
    assert raw.endswith(b"data: [DONE]\n\n")
    parts = raw.decode().split("\n\n")
    assert all(p.startswith("data: ") for p in parts if p)
    return [json.loads(p[6:]) for p in parts if p and p != "data: [DONE]"]


async def stream(svc: OpenAIService, raw: bytes) -> bytes:
    run = await svc.prepare_chat(raw)
    return b"".join([part async for part in run.stream()])


# -- decoding and checks ---------------------------------------------------------------


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logprobs": True}, "logprobs"),
    ({"presence_penalty": 9}, "presence_penalty"),
])
def test_bad_parameters_are_400_naming_the_parameter(fields: dict[str, Any],
                                                     param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        decode(body(**fields), ChatCompletionRequest)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert set(caught.value.body()["error"]) == {"message", "type", "param", "code"}


def test_invalid_json_is_400_and_unknown_fields_are_ignored() -> None:
    with pytest.raises(OpenAIError) as caught:
        decode(b"{not json", ChatCompletionRequest)
    assert caught.value.status == 400
    assert decode(body(some_new_field=1), ChatCompletionRequest).model == "fake"


def test_model_of_reads_only_the_model_field() -> None:
    assert model_of(body()) == "fake"
    assert model_of(b'{"messages": []}') is None
    assert model_of(b"garbage") is None


# -- the stream ------------------------------------------------------------------------


def test_stream_is_openai_sse_with_role_first_and_usage_last() -> None:
    async def go() -> bytes:
        svc = await service()
        return await stream(svc, body(max_tokens=3, stream=True,
                                      stream_options={"include_usage": True}))

    chunks = events(asyncio.run(go()))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"]["content"] for c in chunks[1:4]] == ["t0", " t1", " t2"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:4]] == [None, None, "length"]
    assert all(c["usage"] is None and c["object"] == "chat.completion.chunk"
               for c in chunks[:4])
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"]["completion_tokens"] == 3
    assert chunks[4]["usage"]["prompt_tokens"] == 3  # "user: hi assistant:"
    assert len({c["id"] for c in chunks}) == 1


def test_stream_without_usage_has_no_usage_field_and_n_choices() -> None:
    async def go() -> bytes:
        return await stream(await service(eos_after=2), body(stream=True, n=2))

    chunks = events(asyncio.run(go()))
    assert all("usage" not in c for c in chunks)
    roles = [c for c in chunks if c["choices"][0]["delta"].get("role")]
    assert sorted(c["choices"][0]["index"] for c in roles) == [0, 1]
    finals = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted((f["index"], f["finish_reason"]) for f in finals) == [(0, "stop"),
                                                                        (1, "stop")]


def test_complete_answers_with_message_and_usage() -> None:
    async def go() -> dict[str, Any]:
        svc = await service()
        run = await svc.prepare_chat(body(max_tokens=4))
        return await run.complete()

    answer = asyncio.run(go())
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == "t0 t1 t2 t3"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                               "total_tokens": 7, "prompt_tokens_details": None}


def test_context_length_is_checked_before_the_engine() -> None:
    async def go() -> None:
        svc = await service()
        await svc.prepare_chat(body(max_tokens=100))

    with pytest.raises(OpenAIError) as caught:
        asyncio.run(go())
    assert caught.value.status == 400 and caught.value.param == "max_tokens"
    assert "maximum context length is 64" in caught.value.message


def test_a_stream_closed_early_aborts_its_engine_request() -> None:
    async def go() -> FakeLLMEngine:
        svc = await service(token_delay_s=0.001)
        run = await svc.prepare_chat(body(max_tokens=50, stream=True))
        parts = run.stream()
        await parts.__anext__()
        await parts.aclose()  # what a client disconnect does (the task is cancelled)
        engine = svc.engine
        assert isinstance(engine, FakeLLMEngine)
        return engine

    engine = asyncio.run(go())
    assert len(engine.aborted) == 1 and not engine.active


def test_a_cancelled_request_aborts_its_engine_request() -> None:
    async def go() -> FakeLLMEngine:
        svc = await service(token_delay_s=0.01)
        run = await svc.prepare_chat(body(max_tokens=50, stream=True))

        async def consume() -> None:
            async for _ in run.stream():
                pass

        task = asyncio.get_running_loop().create_task(consume())
        engine = svc.engine
        assert isinstance(engine, FakeLLMEngine)
        await eventually_async(lambda: engine.active, 10, what="the request generating")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert isinstance(svc.engine, FakeLLMEngine)
        return svc.engine

    engine = asyncio.run(go())
    assert len(engine.aborted) == 1 and not engine.active


# -- the ASGI app ----------------------------------------------------------------------


async def call(app: Any, method: str, path: str, raw: bytes = b"") -> tuple[int, dict[str, str],
                                                                           bytes]:
    sent: list[Mapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: Mapping[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": method, "path": path, "root_path": ""}, receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert sent[-1]["more_body"] is False
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def test_asgi_routes_status_codes_and_error_bodies() -> None:
    async def go() -> list[tuple[int, dict[str, str], bytes]]:
        app = OpenAIApp(await service())
        return [await call(app, "GET", "/v1/models"),
                await call(app, "GET", "/v1/models/fake"),
                await call(app, "GET", "/v1/models/other"),
                await call(app, "POST", "/v1/chat/completions", body(model="other")),
                await call(app, "POST", "/v1/chat/completions", body(stream=True,
                                                                      max_tokens=2)),
                await call(app, "GET", "/v1/chat/completions"),
                await call(app, "POST", "/v1/nothing"),
                await call(app, "POST", "/v1/embeddings", b'{"input": "x"}')]

    models, card, unknown, wrong, streamed, method, missing, embed = asyncio.run(go())
    assert models[0] == 200 and json.loads(models[2])["data"][0]["id"] == "fake"
    assert card[0] == 200 and json.loads(card[2])["object"] == "model"
    assert unknown[0] == 404 and wrong[0] == 404
    assert json.loads(wrong[2])["error"]["code"] == "model_not_found"
    assert streamed[0] == 200 and streamed[1]["content-type"].startswith("text/event-stream")
    assert len(events(streamed[2])) == 3
    assert method[0] == 405 and missing[0] == 404
    assert embed[0] == 400  # not a pooling model


@pytest.mark.parametrize(("seconds", "header"), [(0.2, b"1"), (1.0, b"1"), (1.1, b"2"),
                                                (2.5, b"3"), (None, None)])
def test_retry_after_is_whole_seconds_rounded_up(seconds: float | None,
                                                 header: bytes | None) -> None:
    """A shed's Retry-After never sends a client back before the backlog it was shed
    behind could have drained (the proxy's rule, policy/admission.retry_after_header)."""
    from surge.llm.asgi import error_head

    status, headers, _ = error_head(OpenAIError(429, "at capacity", retry_after_s=seconds))
    assert status == 429 and dict(headers).get(b"retry-after") == header


def test_embeddings_on_a_pooling_model() -> None:
    async def go() -> tuple[int, dict[str, str], bytes]:
        return await call(OpenAIApp(await service(pooling=True)), "POST", "/v1/embeddings",
                          b'{"input": ["a b", "c"], "model": "fake"}')

    status, _, raw = asyncio.run(go())
    answer = json.loads(raw)
    assert status == 200 and len(answer["data"]) == 2
    assert len(answer["data"][0]["embedding"]) == 8 and answer["usage"]["prompt_tokens"] == 3


def test_engine_failure_mid_stream_ends_it_with_an_error_event() -> None:
    async def go() -> tuple[int, dict[str, str], bytes]:
        return await call(OpenAIApp(await service(fail_after=2)), "POST",
                          "/v1/chat/completions", body(stream=True, max_tokens=10))

    status, _, raw = asyncio.run(go())
    chunks = events(raw)
    assert status == 200 and chunks[-1]["error"]["type"] == "server_error"


def test_lora_ids_are_base_colon_adapter(tmp_path: Any) -> None:
    (tmp_path / "mine").mkdir()

    async def go() -> list[int]:
        cfg = LLMConfig(model_loading_config={"model_id": "fake"}, llm_engine=FAKE,
                        lora_config={"dynamic_lora_loading_path": f"file://{tmp_path}"})
        engine = FakeLLMEngine(cfg)
        app = OpenAIApp(OpenAIService(cfg, engine, await engine.start()))
        ok = await call(app, "POST", "/v1/chat/completions", body(model="fake:mine"))
        missing = await call(app, "POST", "/v1/chat/completions", body(model="fake:none"))
        listed = await call(app, "GET", "/v1/models")
        assert [m["id"] for m in json.loads(listed[2])["data"]] == ["fake", "fake:mine"]
        assert json.loads(ok[2])["choices"][0]["message"]["content"].startswith("mine0")
        return [ok[0], missing[0]]

    assert asyncio.run(go()) == [200, 404]


# -- configs and builders --------------------------------------------------------------


def test_llm_config_checks_like_ray() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'engine_kwargs'"):
        LLMConfig.from_dict({"model_loading_config": {"model_id": "m"}, "engine_kwarg": {}})
    with pytest.raises(ConfigError, match="num_ingress_replicas"):
        LLMConfig(model_loading_config={"model_id": "m"},
                  experimental_configs={"num_router_replicas": 2})
    with pytest.raises(ConfigError, match="Duplicate models"):
        LLMServingArgs(llm_configs=[{"model_loading_config": {"model_id": "m"}}] * 2)
    with pytest.raises(ConfigError, match="dynamic_lora_loading_path"):
        LLMConfig(model_loading_config={"model_id": "m"},
                  lora_config={"dynamic_lora_loading_path": "http://x"})
    assert LLMConfig(model_loading_config={"model_id": "m"}, accelerator_type="A10"
                     ).accelerator_type == "A10G"


def test_gpus_follow_accelerator_type_and_tensor_parallelism() -> None:
    gpu = LLMConfig(model_loading_config={"model_id": "m"}, accelerator_type="H100",
                    engine_kwargs={"tensor_parallel_size": 4})
    options = LLMServer.get_deployment_options(gpu)
    assert options["ray_actor_options"]["num_gpus"] == 4
    assert options["ray_actor_options"]["resources"] == {"accelerator_type:H100": 0.001}
    cpu = LLMConfig(model_loading_config={"model_id": "m"}, accelerator_config={"kind": "cpu"})
    assert "ray_actor_options" not in LLMServer.get_deployment_options(cpu)


def test_one_model_is_its_own_ingress_several_get_an_openai_ingress() -> None:
    one = build_openai_app({"llm_configs": [config(max_num_seqs=16).model_dump()]})
    assert one.deployment.func_or_class is LLMServer
    assert one.deployment.name == "LLMServer:fake"
    assert one.deployment.config.max_ongoing_requests == 32  # 2 x max_num_seqs (16)
    router = one.deployment.config.request_router_config  # fresh engine signals
    assert (router.request_routing_stats_period_s, router.request_routing_stats_timeout_s) \
        == (0.25, 1.0)
    second = LLMConfig(model_loading_config={"model_id": "org/other.v2"}, llm_engine=FAKE)
    two = build_openai_app(LLMServingArgs(llm_configs=[config(), second]))
    assert two.deployment.func_or_class is OpenAiIngress
    names = sorted(a.deployment.name for a in two.kwargs["llm_deployments"].values())
    assert names == ["LLMServer:fake", "LLMServer:org--other_v2"]


def test_the_app_spec_of_several_models_carries_their_deployments_for_the_proxy() -> None:
    second = LLMConfig(model_loading_config={"model_id": "org/other.v2"}, llm_engine=FAKE)
    spec = build_app_spec(build_openai_app(LLMServingArgs(llm_configs=[config(), second])),
                          "llm", "/")
    assert spec.ingress == "OpenAiIngress"
    assert spec.model_routes == ModelRoutes((("fake", "LLMServer:fake"),
                                             ("org/other.v2", "LLMServer:org--other_v2")))
    assert build_app_spec(build_openai_app({"llm_configs": [config()]}), "one",
                          "/").model_routes is None  # one model: its LLMServer is the ingress

    class Custom(OpenAiIngress):  # may route otherwise: the proxy leaves it alone
        pass

    servers = {"fake": build_llm_deployment(config())}
    custom = deployment(Custom, name="Custom").bind(llm_deployments=servers)
    assert build_app_spec(custom, "c", "/").model_routes is None

    class Handles:  # no serve.ingress: it cannot take HTTP requests straight from a proxy
        def __init__(self, llm_config: Any) -> None: ...

    plain = deployment(Handles).bind(llm_config=config())
    mixed = deployment(OpenAiIngress).bind(llm_deployments={"fake": plain})
    assert build_app_spec(mixed, "m", "/").model_routes is None


def test_a_ray_llm_config_file_with_overrides_keeps_the_model_routes() -> None:
    from surge.api.config_apply import build_specs
    from surge.api.config_file import parse_config

    configs = [{"model_loading_config": {"model_id": m}, "llm_engine": FAKE} for m in "ab"]
    [spec] = build_specs(parse_config({"applications": [{
        "name": "llm", "route_prefix": "/", "import_path": "ray.serve.llm:build_openai_app",
        "args": {"llm_configs": configs},
        "deployments": [{"name": "OpenAiIngress", "num_replicas": 2}]}]}))
    assert spec.model_routes == ModelRoutes((("a", "LLMServer:a"), ("b", "LLMServer:b")))


def test_deployment_config_and_overrides_merge_as_ray() -> None:
    cfg = LLMConfig(model_loading_config={"model_id": "m"}, llm_engine=FAKE,
                    deployment_config={"num_replicas": 2, "max_ongoing_requests": 7})
    app = build_llm_deployment(cfg, name_prefix="x-", override_serve_options={
        "health_check_period_s": 3})
    deployment = app.deployment
    assert deployment.name == "x-m"
    assert deployment.config.max_ongoing_requests == 7
    slow = build_llm_deployment(LLMConfig(
        model_loading_config={"model_id": "m"}, llm_engine=FAKE, deployment_config={
            "request_router_config": {"request_routing_stats_period_s": 2.0}}))
    router = slow.deployment.config.request_router_config  # the user's period wins
    assert (router.request_routing_stats_period_s, router.request_routing_stats_timeout_s) \
        == (2.0, 1.0)
    assert merge_options({"a": {"b": 1, "c": 2}, "autoscaling_config": {}},
                         {"a": {"b": 3}, "num_replicas": 1}) == {"a": {"b": 3, "c": 2},
                                                                 "num_replicas": 1}


def test_the_fake_engine_batches_at_max_num_seqs_and_tags_its_pid() -> None:
    import os

    from surge.llm.engine import Prompt, SamplingParams

    async def go() -> None:
        engine = FakeLLMEngine(config(max_num_seqs=1, batch=True, tag_pid=True,
                                      token_delay_s=0.01))
        await engine.start()

        async def generate(rid: str) -> str:
            deltas = engine.generate(Prompt(text="x", token_ids=(1,)),
                                     SamplingParams(max_tokens=3), rid)
            return "".join([d.text async for d in deltas])

        tasks = [asyncio.create_task(generate(f"r{i}")) for i in range(3)]
        await eventually_async(lambda: len(engine.active) == 3, 10, what="three requests in")
        stats = engine.stats()
        assert (stats.running, stats.waiting) == (1, 2)  # one runs, two wait their turn
        texts = await asyncio.gather(*tasks)
        pid = os.getpid()
        assert texts == [f"p{pid}t0 p{pid}t1 p{pid}t2"] * 3
        assert (engine.stats().running, engine.stats().waiting) == (0, 0)

    asyncio.run(go())
