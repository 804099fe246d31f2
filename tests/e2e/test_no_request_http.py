"""HTTP to deployments whose callable takes no request, end to end (Ray calls them
without it): functions and classes, sync and async, plain values and starlette
Responses through the real proxy. The unit cases are in tests/shells/test_http_entry.py.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def http(surge_instance: Any) -> Iterator[httpx.Client]:
    for name, app in (("hello", hello), ("page", page), ("moved", Moved), ("stream", Stream)):
        serve.run(app.bind(), name=name, route_prefix=f"/{name}")
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
