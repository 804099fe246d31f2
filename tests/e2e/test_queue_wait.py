"""Queues bounded by time (max_queued_requests unset): on every protocol, a request that
would wait longer than the deployment's wait bound is refused at once, and a queued
request whose client left never reaches a replica.

Each deployment takes one request at a time and each takes ~0.6 s, so its router's
bound is one service time (longer than max_queue_wait_s's 0.1 s): after a first call
has measured that, one request may wait behind the running one and a third is refused.
Every refusal is counted, never timed: the machine is shared.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import pytest

from surge import serve
from surge.errors import BackPressureError
from surge.serve.llm import build_openai_app
from tests.e2e.conftest import Running, running_instance
from tests.e2e.dashboard_tools import at_replicas
from tests.e2e.grpc_echo_proto import SERVICER, echo_pb2, echo_pb2_grpc
from tests.eventually import eventually
from tests.ports import free_port

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.e2e

SERVICE_S = 0.6


@serve.deployment(max_ongoing_requests=1)
class OneAtATime:
    def __init__(self) -> None:
        self.started: list[str] = []

    async def __call__(self, request: Any) -> str:
        tag = request.query_params.get("tag", "")
        self.started.append(tag)
        await asyncio.sleep(float(request.query_params.get("sleep", SERVICE_S)))
        return tag

    async def slow(self, tag: str) -> str:
        self.started.append(tag)
        await asyncio.sleep(SERVICE_S)
        return tag

    async def Slow(self, request: Any) -> Any:
        await asyncio.sleep(request.sleep_s)
        return echo_pb2.EchoReply(text="slept")

    def seen(self) -> list[str]:
        return list(self.started)


def at_its_replica(app: str, count: int) -> None:
    eventually(lambda: at_replicas(app) == count, 10,
               what=f"{count} request(s) of {app} at its replica")


def burst(app: str, send: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """Request 0, then (once it holds the replica's one slot) 1, 2 and 3 together."""
    at_its_replica(app, 0)  # the warm-up requests are reported done
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(send, 0)
        at_its_replica(app, 1)
        rest = [pool.submit(send, i) for i in range(1, 4)]
        return [first.result(), *(future.result() for future in rest)]


@pytest.fixture(scope="module")
def instance() -> Iterator[tuple[Running, str]]:
    port = free_port()
    options = {"grpc_options": {"port": port, "grpc_servicer_functions": [SERVICER]},
               "dashboard_port": 0}
    # one proxy worker: the first call measures the service time on the router that
    # the later ones meet
    with running_instance(start_options=options, proxy_workers=1) as running:
        yield running, f"127.0.0.1:{port}"


@pytest.fixture
def app(instance: tuple[Running, str], request: pytest.FixtureRequest) -> str:
    name = request.node.name.split("[")[0].removeprefix("test_")[:40]
    serve.run(OneAtATime.bind(), name=name, route_prefix=f"/{name}")
    request.addfinalizer(lambda: serve.delete(name))
    return name


def test_http_refuses_at_once_what_would_wait_too_long(instance: tuple[Running, str],
                                                       app: str) -> None:
    url = f"{instance[0].url}/{app}"
    assert httpx.get(url, params={"tag": "warm"}, timeout=30).text == "warm"

    responses = burst(app, lambda i: httpx.get(url, params={"tag": str(i)}, timeout=30))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 503, 503], [r.text for r in responses]
    for refused in (r for r in responses if r.status_code == 503):
        assert "max_queue_wait_s" in refused.text
        assert int(refused.headers["retry-after"]) >= 1
    served = {r.text for r in responses if r.status_code == 200}
    assert serve.get_app_handle(app).seen.remote().result() == ["warm", *sorted(served)]


def test_handles_get_backpressure_error_past_the_wait_bound(app: str) -> None:
    handle = serve.get_app_handle(app)
    assert handle.slow.remote("warm").result(timeout_s=30) == "warm"
    running = handle.slow.remote("0")  # sent at once from this thread: it holds the slot
    calls = [handle.slow.remote(str(i)) for i in range(1, 4)]
    outcomes: list[Any] = []
    for call in [running, *calls]:
        try:
            outcomes.append(call.result(timeout_s=30))
        except BackPressureError as exc:
            outcomes.append(exc)
    refused = [o for o in outcomes if isinstance(o, BackPressureError)]
    assert len(refused) == 2, outcomes
    assert all("max_queue_wait_s" in str(error) and error.retry_after_s > 0
               for error in refused)


def test_grpc_answers_resource_exhausted_past_the_wait_bound(instance: tuple[Running, str],
                                                             app: str) -> None:
    metadata = (("application", app),)
    with grpc.insecure_channel(instance[1]) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        assert stub.Slow(echo_pb2.EchoRequest(sleep_s=SERVICE_S), metadata=metadata,
                         timeout=30).text == "slept"
        at_its_replica(app, 0)
        first = stub.Slow.future(echo_pb2.EchoRequest(sleep_s=SERVICE_S), metadata=metadata,
                                 timeout=30)
        at_its_replica(app, 1)
        rest = [stub.Slow.future(echo_pb2.EchoRequest(sleep_s=SERVICE_S), metadata=metadata,
                                 timeout=30) for _ in range(3)]
        codes, details = [], []
        for future in [first, *rest]:
            try:
                future.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                details.append(exc.details())
    assert sorted(codes, key=str) == sorted([grpc.StatusCode.OK] * 2
                                            + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2, key=str)
    assert all("max_queue_wait_s" in d for d in details), details


def test_an_llm_route_refuses_with_the_openai_error_body(instance: tuple[Running, str],
                                                         request: pytest.FixtureRequest) -> None:
    config = {"model_loading_config": {"model_id": "waits"},
              "llm_engine": "surge.testing:FakeLLMEngine",
              "engine_kwargs": {"max_model_len": 256, "token_delay_s": 0.1},
              "deployment_config": {"max_ongoing_requests": 1}}
    serve.run(build_openai_app({"llm_configs": [config]}), name="llmwaits",
              route_prefix="/llmwaits")
    request.addfinalizer(lambda: serve.delete("llmwaits"))
    url = f"{instance[0].url}/llmwaits/v1/chat/completions"
    body = {"model": "waits", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 6}
    for _ in range(2):  # measures ~0.6 s (the proxy may learn the model's route after
        assert httpx.post(url, json=body, timeout=30).status_code == 200  # the first)

    responses = burst("llmwaits", lambda i: httpx.post(url, json=body, timeout=30))
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200, 503} and statuses[0] == 200, statuses
    for refused in (r for r in responses if r.status_code == 503):
        error = refused.json()["error"]
        assert error["code"] == "service_unavailable" and "max_queue_wait_s" in error["message"]
        assert refused.headers["retry-after"]


def test_a_queued_request_whose_client_left_never_reaches_the_replica(
        instance: tuple[Running, str], app: str) -> None:
    url = f"{instance[0].url}/{app}"
    holder = threading.Thread(target=lambda: httpx.get(
        url, params={"tag": "holder", "sleep": "3"}, timeout=30))
    holder.start()
    at_its_replica(app, 1)  # it holds the slot for 3 s
    # queued behind it (nothing measured yet on this app: the count bounds the queue),
    # then its client gives up
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(url, params={"tag": "left"}, timeout=0.2)
    holder.join(30)
    assert httpx.get(url, params={"tag": "after"}, timeout=30).text == "after"
    assert serve.get_app_handle(app).seen.remote().result() == ["holder", "after"]
