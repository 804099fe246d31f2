"""The gRPC port's own HTTP/2 with real clients: what grpc's server would refuse is
refused the same way, a client breaking the protocol loses only its connection, a slow
reader holds its replica back, and compressed calls are served."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from surge import serve
from tests.e2e.conftest import Running, running_instance
from tests.e2e.dashboard_tools import at_replicas
from tests.e2e.grpc_echo_proto import SERVICER, echo_pb2, echo_pb2_grpc
from tests.e2e.procs import rss, surge_processes
from tests.eventually import eventually
from tests.ports import free_port

pytestmark = pytest.mark.e2e

ECHO = (("application", "proto"),)
HEADER_TIMEOUT_S = 1.0


@serve.deployment
class Echo:
    def Say(self, request: Any, grpc_context: Any) -> Any:
        if request.text == "bad trailers":  # HTTP/2 cannot carry these: left out
            grpc_context.set_trailing_metadata([("x-bin", "ключ"), ("Bad Key", "v"),
                                                ("x-text", "ü"), ("grpc-status", "3"),
                                                ("x-fine", "yes")])
        return echo_pb2.EchoReply(text=request.text, blob=request.blob)

    async def Gather(self, requests: Any) -> Any:
        sizes = [len(request.blob) async for request in requests]
        return echo_pb2.EchoReply(text=",".join(map(str, sizes)), index=len(sizes))

    async def Many(self, request: Any) -> Any:
        for index in range(request.count):
            yield echo_pb2.EchoReply(text=request.text, index=index)


@serve.deployment(max_ongoing_requests=1, max_queued_requests=0)
class One:
    async def Gather(self, requests: Any) -> Any:
        count = [request async for request in requests]
        return echo_pb2.EchoReply(index=len(count))


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    port = free_port()
    options = {"grpc_options": {"port": port, "grpc_servicer_functions": [SERVICER]}}
    with running_instance(start_options=options,
                          request_header_timeout_s=HEADER_TIMEOUT_S) as running:
        assert isinstance(running, Running)
        serve.run(Echo.bind(), name="proto", route_prefix="/proto")
        serve.run(One.bind(), name="one", route_prefix="/one")
        yield f"127.0.0.1:{port}"


def say(target: str, text: str = "hi", **options: Any) -> Any:
    with grpc.insecure_channel(target, **options) as channel:
        return echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text=text),
                                                   metadata=ECHO, timeout=10)


def test_an_unknown_method_is_unimplemented(target: str) -> None:
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/surgetest.Echo/Nope")(b"", timeout=10)
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert info.value.details() == "Method not found!"


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_a_compressed_call_is_served(target: str, compression: grpc.Compression) -> None:
    with grpc.insecure_channel(target, compression=compression) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        reply = stub.Say(echo_pb2.EchoRequest(text="z", blob=b"a" * 100_000), metadata=ECHO,
                         timeout=10)
    assert reply.blob == b"a" * 100_000


def test_http1_and_garbage_close_their_connection_and_serving_goes_on(target: str) -> None:
    host, port = target.split(":")
    for opening in (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", os.urandom(64)):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(opening)
            assert _read_to_close(sock)[:0] == b""  # closed, not hung
    assert say(target).text == "hi"


def test_a_connection_that_never_speaks_is_closed_after_the_header_timeout(
        target: str) -> None:
    host, port = target.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        _read_to_close(sock)
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 5


def test_a_protocol_error_is_goaway_for_that_connection_only(target: str) -> None:
    host, port = target.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        sock.sendall(client.data_to_send())
        # DATA on stream 0 is a connection error (RFC 9113 6.1).
        sock.sendall(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")
        events = client.receive_data(_read_to_close(sock))
    goaway = next(e for e in events if isinstance(e, h2.events.ConnectionTerminated))
    assert goaway.error_code == 1  # PROTOCOL_ERROR
    assert say(target).text == "hi"


def test_a_slow_reader_of_a_response_stream_holds_its_replica_back(target: str) -> None:
    proxy = next(pid for pid, title in surge_processes(os.getpid()).items()
                 if title.startswith("surge:proxy"))
    text = "s" * 65_536
    with grpc.insecure_channel(target) as channel:
        stream = echo_pb2_grpc.EchoStub(channel).Many(
            echo_pb2.EchoRequest(text=text, count=5_000), metadata=ECHO, timeout=30)
        assert next(stream).index == 0
        before = rss(proxy)
        time.sleep(3)  # 320 MB asked for; the client takes nothing while it sleeps
        grown = rss(proxy) - before
        indexes = [reply.index for reply in stream]
    assert indexes == list(range(1, 5_000))
    assert grown < 48 * 1024 * 1024, f"the proxy grew {grown / 2**20:.0f} MiB"


def _read_to_close(sock: socket.socket) -> bytes:
    received = b""
    while data := sock.recv(65536):
        received += data
    return received


def test_a_client_stream_message_larger_than_the_window_gets_in(target: str) -> None:
    blob = b"m" * (6 * 1024 * 1024)  # the stream's HTTP/2 window is 4 MiB
    requests = iter([echo_pb2.EchoRequest(blob=b"a" * 10), echo_pb2.EchoRequest(blob=blob),
                     echo_pb2.EchoRequest(blob=b"z")])
    with grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", 16 * 1024 * 1024)]) as channel:
        reply = echo_pb2_grpc.EchoStub(channel).Gather(requests, metadata=ECHO, timeout=30)
    assert reply.text == f"10,{len(blob)},1"


def test_trailers_http2_cannot_carry_are_left_out_and_the_call_answers(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        stub = echo_pb2_grpc.EchoStub(channel)
        reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="bad trailers"),
                                         metadata=ECHO, timeout=10)
        trailing = dict(call.trailing_metadata())
    assert reply.text == "bad trailers"
    assert trailing["x-fine"] == "yes" and trailing["x-bin"] == "ключ".encode()
    assert "x-text" not in trailing and "bad key" not in trailing
    assert call.code() is grpc.StatusCode.OK


def test_a_broken_client_stream_frees_its_replica_slot(target: str) -> None:
    """A compressed message without a grpc-encoding ends the call INTERNAL at the proxy;
    the call is cancelled at its replica too, so the next call gets the only slot."""
    host, port = target.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        client.send_headers(1, [(":method", "POST"), (":scheme", "http"),
                                (":path", "/surgetest.Echo/Gather"), (":authority", "x"),
                                ("content-type", "application/grpc"), ("te", "trailers"),
                                ("application", "one")])
        sock.sendall(client.data_to_send())
        eventually(lambda: at_replicas("one") == 1, 10,
                   what="the call at the replica, holding its one slot")
        client.send_data(1, b"\x01\x00\x00\x00\x01x")
        sock.sendall(client.data_to_send())
        trailers = _trailers_of(sock, client, 1)
    assert trailers["grpc-status"] == "13"
    assert "without a grpc-encoding" in trailers["grpc-message"]
    def gathered() -> bool:  # the cancel reaches the replica a moment later
        with grpc.insecure_channel(target) as channel:
            try:
                reply = echo_pb2_grpc.EchoStub(channel).Gather(
                    iter([echo_pb2.EchoRequest()]), metadata=(("application", "one"),),
                    timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                return False
        return bool(reply.index == 1)

    eventually(gathered, 5, what="the only slot free again")


def test_a_local_call_without_a_message_is_answered(target: str) -> None:
    host, port = target.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        client.send_headers(1, [(":method", "POST"), (":scheme", "http"),
                                (":path", "/ray.serve.RayServeAPIService/Healthz"),
                                (":authority", "x"), ("content-type", "application/grpc"),
                                ("te", "trailers")], end_stream=True)
        sock.sendall(client.data_to_send())
        trailers = _trailers_of(sock, client, 1)
    assert trailers["grpc-status"] == "13" and "no message" in trailers["grpc-message"]


def _trailers_of(sock: socket.socket, client: Any, stream_id: int) -> dict[str, str]:
    """Read until the stream's last header block; it as a dict."""
    while True:
        data = sock.recv(65536)
        assert data, "the connection closed before the call's trailers"
        for event in client.receive_data(data):
            if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived) \
                    and event.stream_id == stream_id and event.stream_ended:
                return {name.decode(): value.decode() for name, value in event.headers}
        sock.sendall(client.data_to_send())
