"""proxy/http.py + server.py: the asyncio shell carries out the core's decisions.

A fake transport and fake routers stand in for the socket and the replicas; the loop is
real (timers, the sweeper)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from surge.errors import BackPressureError
from surge.model import DeploymentId, ProxySpec, RouteTable
from surge.proxy.h1 import MAX_PIPELINED
from surge.proxy.server import Proxy
from surge.router.replica_link import Pending
from surge.transport.messages import HttpRequest, HttpStart
from tests.eventually import eventually_async
from tests.proxy.wire import parse, request, table


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading: list[str] = []  # pause_reading / resume_reading, in order

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading.append("pause")

    def resume_reading(self) -> None:
        self.reading.append("resume")

    def get_extra_info(self, name: str) -> Any:
        return ("10.0.0.1", 5555) if name == "peername" else None


class FakeRouter:
    def __init__(self) -> None:
        self.submitted: list[Pending] = []
        self.cancelled: list[Pending] = []
        self.refuse: BaseException | None = None

    def submit(self, pending: Pending) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append(pending)

    def cancel(self, pending: Pending) -> None:
        self.cancelled.append(pending)


class FakeRuntime:
    def __init__(self, routes: RouteTable) -> None:
        self.routes = routes
        self.routes_received = asyncio.Event()
        self.routers: dict[DeploymentId, FakeRouter] = {}

    def router(self, deployment: DeploymentId) -> FakeRouter:
        return self.routers.setdefault(deployment, FakeRouter())


def run(scenario: Callable[[Proxy, FakeRuntime], Awaitable[None]], **limits: Any) -> None:
    async def main() -> None:
        runtime = FakeRuntime(table("/app"))
        spec = ProxySpec(**{"host": "127.0.0.1", "port": 0, "request_timeout_s": None,
                            "keep_alive_timeout_s": 5.0, "max_body_bytes": 1000, **limits})
        proxy = Proxy(runtime, spec, metrics=True)  # type: ignore[arg-type]
        proxy.port = 8123
        await scenario(proxy, runtime)

    asyncio.run(main())


def connect(proxy: Proxy) -> tuple[Any, FakeTransport]:
    connection = proxy.protocol()
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def router(runtime: FakeRuntime) -> FakeRouter:
    return runtime.routers[DeploymentId("app/app", "Ingress")]


def test_a_request_reaches_its_router_as_a_pending_and_its_answer_the_client() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, transport = connect(proxy)
        connection.data_received(request("POST", "/app/x?q=1", ("x-request-id", "s1"),
                                         body=b"hi"))
        [pending] = router(runtime).submitted
        message = pending.message
        assert isinstance(message, HttpRequest)
        assert (message.method, message.path, message.query, message.body) == (
            "POST", "/app/x", b"q=1", b"hi")
        assert (message.client, message.route_prefix, message.request_id, message.scheme) == (
            "10.0.0.1:5555", "/app", "s1", "http")
        pending.sink.deliver(HttpStart(id=1, status=200, headers=[(b"content-length", b"2")],
                                       body=b"ok", more=False))
        [response] = parse(bytes(transport.written))
        assert (response.status, response.body, response.request_id) == (200, b"ok", "s1")
        assert proxy.recorder.http == {("app/app", "Ingress", "/app", "POST", 200):
                                       proxy.recorder.http[("app/app", "Ingress", "/app",
                                                            "POST", 200)]}
        assert "exchanges=[]" in repr(connection) and not transport.closed

    run(scenario)


def test_overload_at_submit_is_503_with_retry_after_at_once() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, transport = connect(proxy)
        connection.data_received(request())  # makes the router exist
        router(runtime).refuse = BackPressureError(deployment="d", num_queued_requests=1,
                                                   max_queued_requests=1, retry_after_s=2.0)
        connection.data_received(request())
        router(runtime).submitted[0].sink.deliver(
            HttpStart(id=1, status=200, headers=[], body=b"", more=False))
        first, second = parse(bytes(transport.written))
        assert (first.status, second.status, second.headers["retry-after"]) == (200, 503, "2")

    run(scenario)


def test_a_deadline_answers_408_and_cancels_at_the_router() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, transport = connect(proxy)
        connection.data_received(request("GET", "/app", ("x-request-timeout-seconds", "0")))
        await eventually_async(lambda: b"408" in transport.written, 5, what="the 408")
        assert router(runtime).cancelled == router(runtime).submitted

    run(scenario)


def test_reading_pauses_past_the_pipelining_depth_and_resumes_below_it() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, transport = connect(proxy)
        connection.data_received(b"".join(request() for _ in range(MAX_PIPELINED + 1)))
        assert transport.reading == ["pause"]
        submitted = router(runtime).submitted
        assert len(submitted) == MAX_PIPELINED
        for _ in range(2):
            submitted.pop(0).sink.deliver(
                HttpStart(id=1, status=200, headers=[], body=b"", more=False))
        assert transport.reading == ["pause", "resume"] and len(submitted) == MAX_PIPELINED - 1

    run(scenario)


def test_a_client_that_leaves_cancels_its_requests() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, _ = connect(proxy)
        connection.data_received(request() + request())
        connection.connection_lost(None)
        assert router(runtime).cancelled == router(runtime).submitted
        assert proxy.connections == set()
        assert proxy.recorder.http[("app/app", "Ingress", "/app", "GET", 499)].count == 2

    run(scenario)


def test_over_the_connection_cap_the_answer_comes_at_once() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connect(proxy)
        _, refused = connect(proxy)
        assert refused.written.startswith(b"HTTP/1.1 503 ") and refused.closed
        assert b"retry-after: 1" in refused.written
        assert proxy.recorder.rejections == {("", "", "connection_limit"): 1}

    run(scenario, max_connections=1)


def test_a_new_route_table_is_compiled_before_the_next_request() -> None:
    async def scenario(proxy: Proxy, runtime: FakeRuntime) -> None:
        connection, transport = connect(proxy)
        runtime.routes = table("/app", "/new")  # pushed; the follower has not run yet
        connection.data_received(request("GET", "/new/x"))
        [pending] = runtime.routers[DeploymentId("app/new", "Ingress")].submitted
        pending.sink.deliver(HttpStart(id=1, status=204, headers=[], body=b"", more=False))
        connection.data_received(request("GET", "/-/routes"))
        assert b'{"/app": "app/app", "/new": "app/new"}' in transport.written

    run(scenario)
