"""HTTP to deployments whose callable takes no request, end to end (Ray calls them
without it): functions and classes, sync and async, plain values and starlette
Responses through the real proxy; and a child's backpressure that such a `__call__` lets
through, answered as Ray answers it. The unit cases are in tests/shells/test_http_entry.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.responses import HTMLResponse, RedirectResponse, StreamingResponse

from surge import serve

pytestmark = pytest.mark.e2e


@serve.deployment
def hello() -> str:
    return "hi"


@serve.deployment
async def page() -> HTMLResponse:
    return HTMLResponse("<h1>hi</h1>")


@serve.deployment
class Moved:
    def __call__(self) -> RedirectResponse:
        return RedirectResponse("/hello", status_code=302)


async def _words() -> AsyncIterator[str]:
    for word in ("one ", "two ", "three"):
        yield word


@serve.deployment
class Stream:
    async def __call__(self) -> StreamingResponse:
        return StreamingResponse(_words(), media_type="text/plain")


@serve.deployment(max_ongoing_requests=1, max_queued_requests=0)
class Child:
    async def __call__(self) -> str:
        await asyncio.sleep(2.0)
        return "ok"


@serve.deployment
class Parent:
    def __init__(self, child: Any) -> None:
        self.child = child

    async def __call__(self) -> str:
        result: str = await self.child.remote()
        return result


@pytest.fixture(scope="module")
def http(surge_instance: Any) -> Iterator[httpx.Client]:
    for name, app in (("hello", hello.bind()), ("page", page.bind()), ("moved", Moved.bind()),
                      ("stream", Stream.bind()), ("parent", Parent.bind(Child.bind()))):
        serve.run(app, name=name, route_prefix=f"/{name}")
    with httpx.Client(base_url=surge_instance.url, timeout=30) as client:
        yield client


def test_a_function_without_parameters_answers(http: httpx.Client) -> None:
    response = http.get("/hello")
    assert (response.status_code, response.text) == (200, "hi")


def test_an_async_function_returning_html(http: httpx.Client) -> None:
    response = http.get("/page")
    assert (response.status_code, response.text) == (200, "<h1>hi</h1>")
    assert response.headers["content-type"].startswith("text/html")


def test_a_class_returning_a_redirect(http: httpx.Client) -> None:
    response = http.get("/moved")
    assert response.status_code == 302
    assert response.headers["location"] == "/hello"
    assert http.get("/moved", follow_redirects=True).text == "hi"


def test_an_async_class_returning_a_stream(http: httpx.Client) -> None:
    with http.stream("GET", "/stream") as response:
        assert response.status_code == 200
        assert response.headers.get("transfer-encoding") == "chunked"
        assert response.read() == b"one two three"


def test_a_handle_call_takes_no_arguments_either(http: httpx.Client) -> None:
    assert serve.get_app_handle("hello").remote().result(timeout_s=10) == "hi"


def test_a_childs_backpressure_through_call_is_503_without_retry_after(
        surge_instance: Any, http: httpx.Client) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=surge_instance.url, timeout=30) as client:
            return list(await asyncio.gather(*(client.get("/parent") for _ in range(3))))

    responses = asyncio.run(burst())
    assert sorted(r.status_code for r in responses) == [200, 503, 503]
    for refused in (r for r in responses if r.status_code == 503):
        assert refused.text.startswith("Request dropped due to backpressure")
        assert "retry-after" not in refused.headers  # as Ray: none unless configured
