"""The gRPC ingress's sans-IO parts: routing, statuses, servicer recording, metadata in
frames, the two built-in responses, and the replica's pull-driven client stream."""

from __future__ import annotations

import asyncio

import pytest

from surge.errors import (
    BackPressureError,
    ConfigError,
    DeploymentUnavailableError,
    ReplicaDiedError,
    RequestCancelledError,
)
from surge.proxy.grpc_local import field as _field
from surge.proxy.grpc_status import (
    MAX_DETAILS,
    Code,
    Timeout,
    choose_app,
    metadata_value,
    status_of,
    truncate,
)
from surge.replica.grpc_context import RayServegRPCContext, code_number, gRPCInputStream
from surge.transport.grpc_methods import methods_of, pack_metadata, unpack_metadata
from tests.e2e.grpc_echo_proto import SERVICER, echo_pb2

PING = "Ping /ray.serve.RayServeAPIService/ListApplications for available applications."


@pytest.mark.parametrize(("app", "apps", "target", "details"), [
    ("", {"a": 1}, 1, ""),  # one application: any name or none picks it
    ("zzz", {"a": 1}, 1, ""),
    ("b", {"a": 1, "b": 2}, 2, ""),
    ("", {"a": 1, "b": 2}, None, f"Application metadata not set. {PING}"),
    ("c", {"a": 1, "b": 2}, None, f"Application 'c' not found. {PING}"),
    ("c", {}, None, f"Application 'c' not found. {PING}"),
])
def test_choose_app(app: str, apps: dict[str, int], target: int | None, details: str) -> None:
    assert choose_app(app, apps) == (target, details)


def test_statuses_as_ray_names_them() -> None:
    backpressure = BackPressureError(deployment="d", num_queued_requests=2,
                                     max_queued_requests=2, retry_after_s=1.0)
    assert status_of(Timeout(1.5), "r") == (Code.DEADLINE_EXCEEDED,
                                            "Request timed out after 1.5s.")
    assert status_of(RequestCancelledError("x"), "r") == (
        Code.CANCELLED, "Client for request r disconnected.")
    assert status_of(backpressure, "r") == (Code.RESOURCE_EXHAUSTED, str(backpressure))
    assert status_of(DeploymentUnavailableError("gone"), "r") == (Code.UNAVAILABLE, "gone")
    assert status_of(ReplicaDiedError("died"), "r") == (
        Code.INTERNAL, "died; the request may or may not have run.")
    assert status_of(ValueError("boom"), "r") == (Code.INTERNAL, "boom")
    long = truncate("x" * 10_000)
    assert len(long) == MAX_DETAILS and long.endswith("... [truncated]")


def test_metadata_value_skips_binary_values() -> None:
    metadata = (("a-bin", b"\x00"), ("application", "x"))
    assert metadata_value(metadata, "application") == "x"
    assert metadata_value(metadata, "a-bin") == ""
    assert metadata_value(None, "application") == ""


def test_binary_metadata_travels_as_latin_1_text() -> None:
    metadata = (("k", "v"), ("blob-bin", bytes(range(256))))
    packed = pack_metadata(metadata)
    assert all(isinstance(value, str) for _, value in packed)
    assert unpack_metadata(packed) == metadata


def test_a_servicer_function_is_recorded_without_a_server() -> None:
    methods = methods_of(SERVICER)
    kinds = {path: (m.request_streaming, m.response_streaming) for path, m in methods.items()}
    assert kinds == {"/surgetest.Echo/Say": (False, False), "/surgetest.Echo/Slow": (False, False),
                     "/surgetest.Echo/Many": (False, True),
                     "/surgetest.Echo/Gather": (True, False),
                     "/surgetest.Echo/Chat": (True, True)}
    say = methods["/surgetest.Echo/Say"]
    assert say.name == "Say" and say.service == "surgetest.Echo"
    assert say.request_deserializer is not None
    request = say.request_deserializer(echo_pb2.EchoRequest(text="hi").SerializeToString())
    assert request.text == "hi"


@pytest.mark.parametrize(("path", "message"), [
    ("nope_pb2_grpc:add_X_to_server", "can't be imported"),
    ("os:nope", "can't be imported"),
    ("os:sep", "is not a callable function"),
    ("os:getcwd", "is not a gRPC add_"),
    ("nodots", "can't be imported"),
])
def test_servicer_functions_that_cannot_be_used(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        methods_of(path)


def test_the_two_api_responses_are_protobuf() -> None:
    assert _field(1, b"success") == echo_pb2.EchoReply(text="success").SerializeToString()
    long = "a" * 300  # a two-byte length
    assert _field(1, long.encode()) == echo_pb2.EchoReply(text=long).SerializeToString()


def test_the_context_records_what_the_method_sets() -> None:
    import grpc

    context = RayServegRPCContext([("application", "app"), ("request_id", "r1")], "ipv4:x")
    assert (context.application(), context.request_id(), context.peer()) == ("app", "r1",
                                                                              "ipv4:x")
    assert context.status() == (0, "")
    context.set_code(grpc.StatusCode.NOT_FOUND)
    context.set_details("missing")
    context.set_trailing_metadata([("k", "v")])
    assert context.status() == (5, "missing") and context.trailing_metadata() == [("k", "v")]
    assert code_number(grpc.StatusCode.UNAVAILABLE) == 14 and code_number(3) == 3


def test_a_client_stream_is_pulled_half_a_window_at_a_time() -> None:
    pulls: list[int] = []

    async def scenario() -> list[bytes]:
        stream = gRPCInputStream(None, pulls.append, window=4)
        stream.start()
        for body in (b"a", b"b", b"c"):
            stream.feed(body, True)
        taken = [await stream.__anext__(), await stream.__anext__()]
        assert pulls == [4, 2]  # half the window taken: ask for as much again
        stream.feed(b"", False)
        taken += [item async for item in stream]
        return taken

    assert asyncio.run(scenario()) == [b"a", b"b", b"c"]


def test_a_cancelled_client_stream_ends() -> None:
    async def scenario() -> list[bytes]:
        stream = gRPCInputStream(None, lambda n: None)
        stream.start()
        asyncio.get_running_loop().call_soon(stream.cancel)
        return [item async for item in stream]

    assert asyncio.run(scenario()) == []
