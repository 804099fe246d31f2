"""proxy/routes.py + http.py: an OpenAI app's requests go straight to their model's
deployment (one hop), everything else to its ingress; other routes are untouched.

Fake routers stand in for the replicas; the loop, the shell and the core are real."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from surge.model import DeploymentId, ModelRoutes, ProxySpec, RouteTable, RouteTarget
from surge.proxy.h1 import UPLOAD_STREAM_BYTES
from surge.proxy.routes import compile_routes
from surge.proxy.server import Proxy
from surge.transport.messages import HttpRequest, HttpStart
from tests.proxy.test_shell import FakeRouter, FakeRuntime, connect
from tests.proxy.wire import FakeRouter as NamedRouter
from tests.proxy.wire import parse, request

MODELS = ModelRoutes((("a", "LLMServer:a"), ("b", "LLMServer:b")))
TABLE = RouteTable((RouteTarget("llm", "OpenAiIngress", "/llm", None, MODELS),
                    RouteTarget("plain", "Ingress", "/plain")))
CHAT = "/llm/v1/chat/completions"


def run(scenario: Callable[[Proxy, FakeRuntime], Awaitable[None]]) -> None:
    async def main() -> None:
        runtime = FakeRuntime(TABLE)
        spec = ProxySpec(host="127.0.0.1", port=0, request_timeout_s=None,
                         keep_alive_timeout_s=5.0, max_body_bytes=1 << 20)
        proxy = Proxy(runtime, spec, metrics=True)  # type: ignore[arg-type]
        await scenario(proxy, runtime)

    asyncio.run(main())


def routed(runtime: FakeRuntime, deployment: str, app: str = "llm") -> FakeRouter:
    return runtime.routers[DeploymentId(app, deployment)]


def chat(model: str | None, **more: object) -> bytes:
    fields = {"messages": [{"role": "user", "content": "hi"}], **more}
    if model is not None:
        fields["model"] = model
    return request("POST", CHAT, ("content-type", "application/json"),
                   body=json.dumps(fields).encode())


def test_compiling_makes_a_route_per_model_deployment() -> None:
    made: list[str] = []

    def router_for(target: RouteTarget) -> NamedRouter:
        made.append(f"{target.app}#{target.deployment}")
        return NamedRouter(target)

    routes = compile_routes(TABLE, router_for)
    assert made == ["llm#OpenAiIngress", "llm#LLMServer:a", "llm#LLMServer:b", "plain#Ingress"]
    llm, plain = routes.match(CHAT), routes.match("/plain/x")
    assert llm is not None and plain is not None and plain.models is None
    assert llm.models is not None
    assert repr(llm).endswith("<ModelRouting {'a': 'LLMServer:a', 'b': 'LLMServer:b'}>>")
    chosen = llm.models.route_for("POST", CHAT, b'{"model": "b:lora"}', False)
    assert chosen is not None and chosen.models is None
    assert (chosen.prefix, chosen.labels) == ("/llm", ("llm", "LLMServer:b", "/llm"))
    assert chosen.router.name == "llm#LLMServer:b"
    assert llm.models.route_for("POST", CHAT, b'{"model": "c"}', False) is None


def test_each_model_goes_to_its_deployment_and_is_counted_there() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, transport = connect(proxy)
        connection.data_received(chat("a") + chat("b", stream=True))
        [to_a] = routed(runtime, "LLMServer:a").submitted
        [to_b] = routed(runtime, "LLMServer:b").submitted
        assert routed(runtime, "OpenAiIngress").submitted == []
        message = to_b.message
        assert isinstance(message, HttpRequest)
        assert (message.path, message.route_prefix) == (CHAT, "/llm")  # as the ingress got it
        assert json.loads(message.body)["stream"] is True
        for pending in (to_a, to_b):
            pending.sink.deliver(HttpStart(id=1, status=200, headers=[
                (b"content-length", b"2")], body=b"ok", more=False))
        assert [r.status for r in parse(bytes(transport.written))] == [200, 200]
        assert {key[:2] for key in proxy.recorder.http} == {("llm", "LLMServer:a"),
                                                            ("llm", "LLMServer:b")}

    run(scenario)


def test_a_streamed_upload_goes_to_the_ingress() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, _ = connect(proxy)
        big = json.dumps({"model": "a", "prompt": "x" * UPLOAD_STREAM_BYTES}).encode()
        connection.data_received(request("POST", "/llm/v1/completions", body=big))
        [pending] = routed(runtime, "OpenAiIngress").submitted
        assert pending.message.more_body  # type: ignore[union-attr]
        assert routed(runtime, "LLMServer:a").submitted == []

    run(scenario)


def test_unread_requests_reach_the_ingress_in_order() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, transport = connect(proxy)
        connection.data_received(request("GET", "/llm/v1/models") + chat("nope") + chat(None)
                                 + request("POST", CHAT, body=b"{not json"))
        ingress = routed(runtime, "OpenAiIngress").submitted
        assert [p.message.path for p in ingress] == [  # type: ignore[union-attr]
            "/llm/v1/models", CHAT, CHAT, CHAT]
        for pending in ingress:
            pending.sink.deliver(HttpStart(id=1, status=404, headers=[
                (b"content-length", b"0")], body=b"", more=False))
        assert len(parse(bytes(transport.written))) == 4
        assert {key[:2] for key in proxy.recorder.http} == {("llm", "OpenAiIngress")}

    run(scenario)


def test_a_cancel_reaches_the_model_deployment_that_has_the_request() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, _ = connect(proxy)
        connection.data_received(chat("a", stream=True))
        connection.connection_lost(None)
        to_a = routed(runtime, "LLMServer:a")
        assert to_a.cancelled == to_a.submitted and len(to_a.cancelled) == 1
        assert routed(runtime, "OpenAiIngress").cancelled == []

    run(scenario)


def test_other_routes_are_not_read() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, _ = connect(proxy)
        connection.data_received(request("POST", "/plain/v1/chat/completions",
                                         body=b'{"model": "a"}'))
        [pending] = routed(runtime, "Ingress", "plain").submitted
        assert pending.message.route_prefix == "/plain"  # type: ignore[union-attr]
        assert proxy.site.routes().match("/plain").models is None  # type: ignore[union-attr]

    run(scenario)
