"""gRPC ingress (Ray Serve's grpc_options) with a real grpcio client and a compiled .proto:
routing by `application` metadata, the four streaming kinds, grpc_context, status codes,
request_id trailers, large messages, deadlines, cancellation, backpressure."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from surge import serve
from surge.errors import ConfigError
from tests.e2e.conftest import Running, running_instance
from tests.e2e.dashboard_tools import scrape, total
from tests.e2e.grpc_echo_proto import SERVICER, echo_pb2, echo_pb2_grpc
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
TOKEN = "a-grpc-test-token-0123456789"
TIMEOUT_S = 6.0  # grpc_options.request_timeout_s: room for 64 MiB each way on a busy machine


@serve.deployment(max_ongoing_requests=4, max_queued_requests=2)
class Echo:
    def Say(self, request: Any, grpc_context: Any) -> Any:
        if request.text == "fail":
            raise ValueError("boom")
        if request.text == "code":
            grpc_context.set_code(grpc.StatusCode.NOT_FOUND)
            grpc_context.set_details("no such thing")
            return echo_pb2.EchoReply()
        if request.text == "context":
            context = serve.context._get_serve_request_context()
            return echo_pb2.EchoReply(text=f"{context.app_name}|{context.request_id}|"
                                           f"{serve.get_multiplexed_model_id()}|"
                                           f"{grpc_context.application()}")
        grpc_context.set_trailing_metadata([("x-echo", "yes")])
        return echo_pb2.EchoReply(text=request.text, blob=request.blob, index=len(request.blob))

    async def Slow(self, request: Any) -> Any:
        await asyncio.sleep(request.sleep_s)
        return echo_pb2.EchoReply(text="slept")

    async def Many(self, request: Any) -> Any:
        for index in range(request.count):
            yield echo_pb2.EchoReply(text=request.text, index=index)

    async def Gather(self, requests: Any) -> Any:
        texts = [request.text async for request in requests]
        return echo_pb2.EchoReply(text=",".join(texts), index=len(texts))

    async def Chat(self, requests: Any) -> Any:
        async for request in requests:
            yield echo_pb2.EchoReply(text=request.text.upper())


@serve.deployment
class Other:
    def Say(self, request: Any) -> Any:
        if request.text == "die":
            os._exit(1)  # the replica dies mid-call
        return echo_pb2.EchoReply(text="other")


@pytest.fixture(scope="module")
def grpc_app() -> Iterator[tuple[Running, str]]:
    port = free_port()
    options = {"grpc_options": {"port": port, "grpc_servicer_functions": [SERVICER],
                                "request_timeout_s": TIMEOUT_S,
                                "enable_health_service": True},
               "dashboard_port": 0}
    with running_instance(start_options=options) as running:
        serve.run(Echo.bind(), name="echo", route_prefix="/echo")
        serve.run(Other.bind(), name="other", route_prefix="/other")
        serve.run(Other.bind(), name="locked", route_prefix="/locked",
                  auth={"tokens": [TOKEN]})
        yield running, f"127.0.0.1:{port}"


@pytest.fixture
def stub(grpc_app: tuple[Running, str]) -> Iterator[Any]:
    with grpc.insecure_channel(grpc_app[1], options=[
            ("grpc.max_send_message_length", 100 * MiB),
            ("grpc.max_receive_message_length", 100 * MiB)]) as channel:
        yield echo_pb2_grpc.EchoStub(channel)


ECHO = (("application", "echo"),)


def test_unary_call_routes_by_application_and_sends_request_id_back(stub: Any) -> None:
    reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="hi"), metadata=ECHO)
    assert reply.text == "hi"
    trailers = dict(call.trailing_metadata())
    assert trailers["x-echo"] == "yes"
    assert len(trailers["request_id"]) >= 16  # generated
    other = stub.Say(echo_pb2.EchoRequest(text="hi"), metadata=(("application", "other"),))
    assert other.text == "other"


def test_request_id_and_model_id_metadata_reach_the_replica(stub: Any) -> None:
    metadata = (*ECHO, ("request_id", "rid-123"), ("multiplexed_model_id", "m7"))
    reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="context"), metadata=metadata)
    assert reply.text == "echo|rid-123|m7|echo"
    assert dict(call.trailing_metadata())["request_id"] == "rid-123"


def test_without_application_metadata_is_not_found_as_ray(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Say(echo_pb2.EchoRequest(text="hi"))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert info.value.details() == ("Application metadata not set. Ping "
                                    "/ray.serve.RayServeAPIService/ListApplications for "
                                    "available applications.")
    with pytest.raises(grpc.RpcError) as info:
        stub.Say(echo_pb2.EchoRequest(text="hi"), metadata=(("application", "nope"),))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert info.value.details().startswith("Application 'nope' not found. Ping ")


def test_user_error_is_internal_with_its_text_and_a_set_code_is_kept(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Say(echo_pb2.EchoRequest(text="fail"), metadata=ECHO)
    assert info.value.code() is grpc.StatusCode.INTERNAL
    assert "boom" in info.value.details()
    assert "request_id" in dict(info.value.trailing_metadata())
    with pytest.raises(grpc.RpcError) as info:
        stub.Say(echo_pb2.EchoRequest(text="code"), metadata=ECHO)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "no such thing"


def test_ray_serve_api_service(grpc_app: tuple[Running, str]) -> None:
    with grpc.insecure_channel(grpc_app[1]) as channel:
        listed = channel.unary_unary("/ray.serve.RayServeAPIService/ListApplications")(b"")
        healthz = channel.unary_unary("/ray.serve.RayServeAPIService/Healthz")(b"")
    # ListApplicationsResponse{application_names}; HealthzResponse{message}
    assert b"echo" in listed and b"other" in listed
    assert healthz == b"\n\x07success"


def test_the_standard_health_service(grpc_app: tuple[Running, str]) -> None:
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    health_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
    with grpc.insecure_channel(grpc_app[1]) as channel:
        health = health_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert health.Check(health_pb2.HealthCheckRequest()).status == serving
        assert health.Check(health_pb2.HealthCheckRequest(service="surgetest.Echo")) \
            .status == serving
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="nope.Service"))
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        watch = health.Watch(health_pb2.HealthCheckRequest())
        assert next(watch).status == serving
        watch.cancel()


def test_server_reflection_lists_the_services(grpc_app: tuple[Running, str]) -> None:
    database = pytest.importorskip(
        "grpc_reflection.v1alpha.proto_reflection_descriptor_database")
    with grpc.insecure_channel(grpc_app[1]) as channel:
        reflection = database.ProtoReflectionDescriptorDatabase(channel)
        services = set(reflection.get_services())
        assert "surgetest.Echo" in services
        found = reflection.FindFileContainingSymbol("surgetest.Echo")
        assert found.name == "surge_echo.proto"


def test_the_four_streaming_kinds(stub: Any) -> None:
    many = list(stub.Many(echo_pb2.EchoRequest(text="s", count=50), metadata=ECHO))
    assert [reply.index for reply in many] == list(range(50))
    requests = (echo_pb2.EchoRequest(text=str(i)) for i in range(40))
    gathered = stub.Gather(requests, metadata=ECHO)
    assert gathered.index == 40 and gathered.text == ",".join(str(i) for i in range(40))
    chat = stub.Chat(iter([echo_pb2.EchoRequest(text=t) for t in ("a", "b", "c")]),
                     metadata=ECHO)
    assert [reply.text for reply in chat] == ["A", "B", "C"]


def test_a_64_mib_message_both_ways(stub: Any) -> None:
    blob = bytes(range(256)) * (64 * MiB // 256)
    reply = stub.Say(echo_pb2.EchoRequest(text="big", blob=blob), metadata=ECHO, timeout=60)
    assert reply.index == len(blob) and reply.blob == blob


def test_the_client_deadline_is_the_request_timeout(stub: Any) -> None:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        stub.Slow(echo_pb2.EchoRequest(sleep_s=5), metadata=ECHO, timeout=0.5)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 3


def test_backpressure_is_resource_exhausted_as_ray(stub: Any) -> None:
    futures = [stub.Slow.future(echo_pb2.EchoRequest(sleep_s=1.5), metadata=ECHO)
               for _ in range(12)]
    codes = []
    for future in futures:
        try:
            future.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    assert codes.count(grpc.StatusCode.OK) >= 4
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes


def test_a_cancelled_call_frees_its_replica_slot(grpc_app: tuple[Running, str],
                                                 stub: Any) -> None:
    dashboard = serve.status().dashboard_address
    futures = [stub.Slow.future(echo_pb2.EchoRequest(sleep_s=30), metadata=ECHO)
               for _ in range(4)]  # every slot of the replica (max_ongoing_requests=4)
    eventually(lambda: total(scrape(dashboard), "serve_num_ongoing_grpc_requests") == 4, 10,
               what="4 calls in flight")
    for future in futures:
        future.cancel()
    started = time.monotonic()
    # The cancels reach the replica: a call gets a slot well before the calls time out.
    reply = eventually(lambda: stub.Say(echo_pb2.EchoRequest(text="after"), metadata=ECHO,
                                        timeout=0.5), TIMEOUT_S, what="a free slot")
    assert reply.text == "after" and time.monotonic() - started < TIMEOUT_S - 1


def test_request_timeout_s_without_a_client_deadline(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Slow(echo_pb2.EchoRequest(sleep_s=30), metadata=ECHO)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() == f"Request timed out after {TIMEOUT_S}s."


def test_calls_are_counted_in_rays_grpc_metrics(stub: Any) -> None:
    stub.Say(echo_pb2.EchoRequest(text="count me"), metadata=ECHO)
    dashboard = serve.status().dashboard_address

    def counted() -> bool:
        samples = scrape(dashboard)
        return (total(samples, "serve_num_grpc_requests_total", application="echo",
                      method="/surgetest.Echo/Say", status_code="OK") >= 1
                and total(samples, "ray_serve_num_grpc_requests_total", route="echo",
                          status_code="OK") >= 1
                and total(samples, "serve_num_grpc_error_requests_total",
                          error_code="NOT_FOUND") >= 1)
    eventually(counted, 10, what="the gRPC calls in /metrics")


def test_a_replica_that_dies_mid_call_is_internal(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Say(echo_pb2.EchoRequest(text="die"), metadata=(("application", "other"),),
                 timeout=10)
    assert info.value.code() is grpc.StatusCode.INTERNAL
    assert "may or may not have run" in info.value.details()
    # Its replacement serves.
    reply = eventually(lambda: stub.Say(echo_pb2.EchoRequest(text="hi"),
                                        metadata=(("application", "other"),), timeout=2),
                       30, what="the replaced replica")
    assert reply.text == "other"


def test_an_applications_bearer_tokens_hold_over_grpc(stub: Any) -> None:
    locked = (("application", "locked"),)
    request = echo_pb2.EchoRequest(text="hi")
    for metadata in (locked, (*locked, ("authorization", "Bearer wrong-token-0123456789"))):
        with pytest.raises(grpc.RpcError) as info:
            stub.Say(request, metadata=metadata)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert stub.Say(request, metadata=(*locked, ("authorization", f"Bearer {TOKEN}"))) \
        .text == "other"


def test_with_one_application_any_name_or_none_routes_to_it(stub: Any) -> None:
    serve.delete("other")
    serve.delete("locked")
    assert stub.Say(echo_pb2.EchoRequest(text="solo")).text == "solo"
    assert stub.Say(echo_pb2.EchoRequest(text="solo"),
                    metadata=(("application", "whatever"),)).text == "solo"


def test_a_servicer_function_that_does_not_import_is_a_clear_error() -> None:
    options = {"port": free_port(), "grpc_servicer_functions": ["no_such_pb2_grpc:add_X"]}
    with pytest.raises(ConfigError, match="no_such_pb2_grpc:add_X can't be imported"):
        serve.start(grpc_options=options)
