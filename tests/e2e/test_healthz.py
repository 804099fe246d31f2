"""`/-/healthz` and `/-/routes` of a new instance, as Ray's proxy answers them: 503
"Route table is not populated yet." until an application with a route prefix exists
(one without a prefix is not enough), 200 from then on, also after it is deleted.
gRPC's RayServeAPIService Healthz and ListApplications follow the same check (Ray's
proxies share one router): UNAVAILABLE with the same message until then.
The proxy's side alone: tests/proxy/test_h1.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest

from surge import serve
from tests.e2e.conftest import running_instance
from tests.e2e.grpc_echo_proto import SERVICER
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e

NOT_POPULATED = (503, "Route table is not populated yet.")
API = "/ray.serve.RayServeAPIService"


@serve.deployment
def hello() -> str:
    return "hi"


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[httpx.Client, grpc.Channel]]:
    port = free_port()
    options = {"grpc_options": {"port": port, "grpc_servicer_functions": [SERVICER]}}
    with running_instance(start_options=options) as running, \
            httpx.Client(base_url=running.url, timeout=30) as client, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield client, channel


@pytest.fixture(scope="module")
def http(clients: tuple[httpx.Client, grpc.Channel]) -> httpx.Client:
    return clients[0]


def grpc_answer(channel: grpc.Channel, method: str) -> tuple[grpc.StatusCode, str]:
    try:
        channel.unary_unary(f"{API}/{method}")(b"", timeout=30)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def answer(http: httpx.Client, path: str) -> tuple[int, str]:
    response = http.get(path)
    return response.status_code, response.text


def test_healthz_follows_the_route_table(clients: tuple[httpx.Client, grpc.Channel]) -> None:
    http, channel = clients
    unavailable = (grpc.StatusCode.UNAVAILABLE, NOT_POPULATED[1])
    assert answer(http, "/-/healthz") == NOT_POPULATED  # no application yet
    assert answer(http, "/-/routes") == NOT_POPULATED
    assert grpc_answer(channel, "Healthz") == unavailable
    assert grpc_answer(channel, "ListApplications") == unavailable

    serve.run(hello.bind(), name="handles_only", route_prefix=None)
    assert answer(http, "/-/healthz") == NOT_POPULATED  # an app, but no route
    assert grpc_answer(channel, "Healthz") == unavailable

    serve.run(hello.bind(), name="routed", route_prefix="/hello")
    eventually(lambda: answer(http, "/-/healthz") == (200, "success"), 10,
               what="healthz to answer 200 once a route exists")
    assert http.get("/-/routes").json() == {"/hello": "routed"}
    assert grpc_answer(channel, "Healthz") == (grpc.StatusCode.OK, "")
    assert grpc_answer(channel, "ListApplications") == (grpc.StatusCode.OK, "")

    serve.delete("routed")
    eventually(lambda: http.get("/hello").status_code == 404, 10, what="the route to go")
    assert answer(http, "/-/healthz") == (200, "success")  # populated once, for good
