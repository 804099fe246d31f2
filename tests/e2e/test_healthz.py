"""`/-/healthz` and `/-/routes` of a new instance, as Ray's proxy answers them: 503
"Route table is not populated yet." until an application with a route prefix exists
(one without a prefix is not enough), 200 from then on, also after it is deleted.
The proxy's side alone: tests/proxy/test_h1.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from surge import serve
from tests.e2e.conftest import running_instance
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

NOT_POPULATED = (503, "Route table is not populated yet.")


@serve.deployment
def hello() -> str:
    return "hi"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with running_instance() as running, \
            httpx.Client(base_url=running.url, timeout=30) as client:
        yield client


def answer(http: httpx.Client, path: str) -> tuple[int, str]:
    response = http.get(path)
    return response.status_code, response.text


def test_healthz_follows_the_route_table(http: httpx.Client) -> None:
    assert answer(http, "/-/healthz") == NOT_POPULATED  # no application yet
    assert answer(http, "/-/routes") == NOT_POPULATED

    serve.run(hello.bind(), name="handles_only", route_prefix=None)
    assert answer(http, "/-/healthz") == NOT_POPULATED  # an app, but no route

    serve.run(hello.bind(), name="routed", route_prefix="/hello")
    eventually(lambda: answer(http, "/-/healthz") == (200, "success"), 10,
               what="healthz to answer 200 once a route exists")
    assert http.get("/-/routes").json() == {"/hello": "routed"}

    serve.delete("routed")
    eventually(lambda: http.get("/hello").status_code == 404, 10, what="the route to go")
    assert answer(http, "/-/healthz") == (200, "success")  # populated once, for good
