"""How the replica calls a deployment's HTTP entry point (UserCode.handle_http, no
processes): with the starlette Request when `__call__` takes a parameter, without it
when it takes none (Ray's rule, for functions and classes, sync and async), and what
each such callable returns reaches the client as the same ASGI messages. A child
deployment's refusal that `__call__` lets through is answered as Ray answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)

from surge.errors import BackPressureError, DeploymentUnavailableError
from surge.replica.user_code import UserCode, asgi_scope, takes_request


def sync_fn() -> str:
    return "hi"


async def async_fn() -> str:
    return "hi"


class SyncClass:
    def __call__(self) -> str:
        return "hi"


class AsyncClass:
    async def __call__(self) -> str:
        return "hi"


class TakesRequest:
    async def __call__(self, request: Request) -> str:
        return request.url.path


class TakesAnything:
    def __call__(self, *args: Any) -> str:
        return type(args[0]).__name__


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def serve_one(target: Any, path: str = "/x") -> tuple[int, dict[str, str], bytes]:
    """One GET through handle_http: the status, headers and whole body the client gets."""
    user = UserCode(target, (), {}, max_ongoing_requests=2)
    await user.construct()
    sent: list[MutableMapping[str, Any]] = []
    bodies = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> MutableMapping[str, Any]:
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # the client stays: no disconnect comes
        raise AssertionError("unreachable")

    async def send(event: MutableMapping[str, Any]) -> None:
        sent.append(event)

    scope = asgi_scope("GET", path, b"", [], "127.0.0.1:5000", "/", "1.1")
    try:
        simple = await user.handle_http(scope, receive, send)
    finally:
        user.close()
    if simple is not None:
        status, headers, body = simple
    else:
        status = sent[0]["status"]
        headers = sent[0]["headers"]
        body = b"".join(bytes(e.get("body", b"")) for e in sent[1:])
    return status, {k.decode(): v.decode() for k, v in headers}, body


@pytest.mark.parametrize("target", [sync_fn, async_fn, SyncClass, AsyncClass],
                         ids=["def", "async-def", "class-def", "class-async-def"])
def test_a_callable_without_parameters_is_called_without_the_request(target: Any) -> None:
    status, headers, body = run(serve_one(target))
    assert (status, body) == (200, b"hi")
    assert headers["content-type"].startswith("text/plain")


def test_a_callable_with_a_parameter_gets_the_request() -> None:
    assert run(serve_one(TakesRequest, "/some/path"))[2] == b"/some/path"


def test_star_args_takes_the_request() -> None:
    assert run(serve_one(TakesAnything))[2] == b"Request"


def test_the_decision_is_made_once_at_construction() -> None:
    async def scenario() -> tuple[bool, bool]:
        user = UserCode(SyncClass, (), {}, max_ongoing_requests=1)
        before = user.http_takes_request
        await user.construct()
        user.close()
        return before, user.http_takes_request

    assert run(scenario()) == (True, False)


def test_takes_request_reads_the_signature() -> None:
    assert not takes_request(sync_fn)
    assert not takes_request(SyncClass().__call__)
    assert takes_request(TakesRequest().__call__)
    assert takes_request(TakesAnything().__call__)
    assert takes_request(len)  # a builtin: a signature if it has one, else the request
    assert takes_request(dict)  # no signature to read: the request, as before


async def _chunks() -> AsyncIterator[str]:
    for word in ("a", "b", "c"):
        yield word


def _responses() -> list[tuple[str, Callable[[], Any], int, str, bytes]]:
    """(id, the no-argument callable, status, content-type prefix, body)."""
    return [
        ("html", lambda: HTMLResponse("<b>hi</b>"), 200, "text/html", b"<b>hi</b>"),
        ("plain", lambda: PlainTextResponse("hi", status_code=201), 201, "text/plain", b"hi"),
        ("json", lambda: JSONResponse({"a": 1}), 200, "application/json", b'{"a":1}'),
        ("redirect", lambda: RedirectResponse("/elsewhere"), 307, "", b""),
        ("streaming", lambda: StreamingResponse(_chunks(), media_type="text/plain"), 200,
         "text/plain", b"abc"),
    ]


@pytest.mark.parametrize(("make", "status", "content_type", "body"),
                         [case[1:] for case in _responses()],
                         ids=[case[0] for case in _responses()])
@pytest.mark.parametrize("form", ["function", "async-function", "class", "async-class"])
def test_starlette_responses_from_a_callable_without_parameters(
        form: str, make: Callable[[], Any], status: int, content_type: str,
        body: bytes) -> None:
    target = _form(form, make)
    got_status, headers, got_body = run(serve_one(target))
    assert (got_status, got_body) == (status, body)
    assert headers.get("content-type", "").startswith(content_type)
    if status == 307:
        assert headers["location"] == "/elsewhere"


def _form(form: str, make: Callable[[], Any]) -> Any:
    """`make` as a deployment's callable of the given form, each taking no request."""
    if form == "function":
        def function() -> Any:
            return make()
        return function
    if form == "async-function":
        async def coroutine() -> Any:
            return make()
        return coroutine

    class Sync:
        def __call__(self) -> Any:
            return make()

    class Async:
        async def __call__(self) -> Any:
            return make()

    return Sync if form == "class" else Async


def _refusing(exc: Exception) -> Any:
    class Parent:  # a child deployment's refusal lets through its __call__
        async def __call__(self) -> str:
            raise exc
    return Parent


def _backpressure(advise_retry: bool, status_code: int = 503) -> BackPressureError:
    return BackPressureError(deployment="child", num_queued_requests=1, max_queued_requests=1,
                             retry_after_s=6.5, status_code=status_code,
                             advise_retry=advise_retry)


def test_a_childs_backpressure_is_its_status_without_retry_after_by_default() -> None:
    status, headers, body = run(serve_one(_refusing(_backpressure(advise_retry=False))))
    assert status == 503 and "retry-after" not in headers
    assert body.startswith(b"Request dropped due to backpressure")


def test_a_childs_advised_backpressure_carries_retry_after() -> None:
    refusal = _backpressure(advise_retry=True, status_code=429)
    status, headers, _ = run(serve_one(_refusing(refusal)))
    assert (status, headers["retry-after"]) == (429, "7")


def test_a_childs_unavailability_is_503() -> None:
    status, headers, body = run(serve_one(_refusing(DeploymentUnavailableError("no replicas"))))
    assert (status, body) == (503, b"no replicas") and "retry-after" not in headers
