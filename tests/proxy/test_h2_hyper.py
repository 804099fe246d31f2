"""bench/h2_hyper.py, the A/B's subject: python-hyper's h2 behind the gRPC core, in
memory (the client and GrpcCore of test_grpc_core.py, the core's codec swapped for the
adapter before any bytes). What the adapter adds to h2 is pinned here: data held past
the client's windows with the trailers behind it, the connection's window given back
as data comes and a stream's as it is consumed, and a drain's GOAWAY that lets open
calls finish; and the one place h2 decides otherwise than surge's stack (a malformed
request ends the connection, not only its stream)."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from bench.h2_hyper import HyperConnection

from surge.codecs.h2 import H2Error
from surge.codecs.h2_frames import PROTOCOL_ERROR, REFUSED_STREAM
from surge.codecs.h2_send import MAX_HELD_BYTES, HeldLimitError
from surge.transport.messages import GrpcEnd, Item, Pull
from tests.proxy.test_grpc_core import SAY, UPLOAD, Client, Link, ended


class HyperClient(Client):
    """A fresh client connection to the core's codec, swapped for the adapter."""

    def __init__(self) -> None:
        super().__init__()
        core = self.core
        core.h2 = HyperConnection(core, 1024, self.site.max_header_bytes)  # type: ignore[assignment]
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.pump()


def test_a_unary_call_is_answered_through_h2() -> None:
    client = HyperClient()
    stream = client.call(SAY.path, b"hello", metadata=(("request_id", "r1"),))
    [call] = client.take()["submits"]
    assert call.pending.message.body == b"hello"
    client.deliver(call, GrpcEnd(0, 0, "", [("t", "1")], b"world", True))
    answer = client.answers[stream]
    assert answer.headers[":status"] == "200" and answer.messages == [b"world"]
    assert answer.status == 0 and answer.trailers["request_id"] == "r1"
    assert ended(client.take()) == [0] and client.core.calls == {}


def test_data_past_the_clients_window_is_held_and_the_trailers_wait_behind_it() -> None:
    client = HyperClient()
    client.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
    client.pump()
    stream = client.call(SAY.path, b"x")
    [call] = client.take()["submits"]
    hyper = client.core.h2
    assert isinstance(hyper, HyperConnection)
    client.deliver(call, Item(0, b"a" * 30))  # 35 bytes framed: 10 go, 25 are held
    assert list(hyper.blocked) == [stream] and client.take()["acks"] == []
    client.h2.increment_flow_control_window(25, stream)
    client.pump()
    assert [n for _, n in client.take()["acks"]] == [30] and not hyper.blocked  # drained
    client.deliver(call, GrpcEnd(0, 0, "", [], b"b" * 1000, True))  # past the window
    assert list(hyper.blocked) == [stream] and client.answers[stream].trailers == {}
    client.h2.increment_flow_control_window(1000, stream)
    client.pump()
    assert client.answers[stream].status == 0 and not hyper.busy()


def test_a_stream_holds_at_most_its_limit() -> None:
    client = HyperClient()
    client.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    client.pump()
    stream = client.call(SAY.path, b"x")
    hyper = client.core.h2
    assert not hyper.send_data(stream, b"y" * MAX_HELD_BYTES)
    with pytest.raises(HeldLimitError) as raised:
        hyper.send_data(stream, b"z")
    assert (raised.value.stream_id, raised.value.held) == (stream, MAX_HELD_BYTES)


def test_a_client_streams_window_comes_back_as_the_replica_pulls() -> None:
    client = HyperClient()
    stream = client.call(UPLOAD.path, *[b"m" * 400_000] * 3, end=False)
    [call] = client.take()["submits"]
    window = client.h2.local_flow_control_window(stream)
    call.pending.link = Link()  # type: ignore[assignment]
    client.deliver(call, Pull(0, 3))
    assert len(client.take()["sends"]) == 3
    # 1.2 MB consumed, past a quarter of the stream's 4 MiB window: given back at once
    assert client.h2.local_flow_control_window(stream) == window + 3 * 400_005


def test_a_drain_lets_open_calls_finish_and_refuses_new_ones() -> None:
    client = HyperClient()
    first = client.call(SAY.path, b"x")
    [call] = client.take()["submits"]
    client.core.going_away()
    client.pump()
    assert client.goaway
    # A client that opens a stream after the GOAWAY (h2's own would not: it is told to)
    client.h2.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
    second = client.call(SAY.path, b"y")
    assert client.answers[second].reset == REFUSED_STREAM and client.take()["submits"] == []
    client.deliver(call, GrpcEnd(0, 0, "", [], b"done", True))
    assert client.answers[first].messages == [b"done"]


def test_h2_ends_the_connection_for_a_malformed_request() -> None:
    client = HyperClient()
    client.h2.config.validate_outbound_headers = False  # the client sends it as it is
    client.h2.config.normalize_outbound_headers = False
    client.h2.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", SAY.path),
                               (":authority", "x"), ("content-type", "application/grpc"),
                               ("te", "trailers"), ("connection", "close")], end_stream=True)
    with pytest.raises(H2Error) as raised:  # surge's stack: RST_STREAM, the connection lives
        client.core.receive(client.h2.data_to_send())
    assert raised.value.code == PROTOCOL_ERROR
    events = client.h2.receive_data(b"".join(client.core.h2.out))
    assert [e.error_code for e in events if isinstance(e, h2.events.ConnectionTerminated)] == [
        PROTOCOL_ERROR]
    assert client.take()["submits"] == []  # never served


def test_held_data_goes_when_the_client_raises_its_initial_window() -> None:
    client = HyperClient()
    client.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    client.pump()
    client.call(SAY.path, b"x")
    [call] = client.take()["submits"]
    client.deliver(call, Item(0, b"a" * 30))  # all of it held: no update will come
    assert client.take()["acks"] == []
    client.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    client.pump()
    assert [n for _, n in client.take()["acks"]] == [30] and not client.core.h2.blocked


def test_held_data_goes_when_the_connections_window_opens() -> None:
    client = HyperClient()
    client.call(SAY.path, b"x")
    [call] = client.take()["submits"]
    client.h2.increment_flow_control_window(1 << 20, 1)  # the stream's is not the bound
    client.pump()
    client.deliver(call, Item(0, b"b" * 100_000))  # past the connection's 65,535
    assert list(client.core.h2.blocked) == [1] and client.take()["acks"] == []
    client.h2.increment_flow_control_window(100_000)
    client.pump()
    assert [n for _, n in client.take()["acks"]] == [100_000] and not client.core.h2.blocked


def test_the_connections_window_comes_back_as_data_arrives() -> None:
    client = HyperClient()
    before = client.h2.outbound_flow_control_window
    for _ in range(3):  # 9 MB in all, none of it pulled: only the streams' windows keep it
        client.call(UPLOAD.path, *[b"u" * 1_000_000] * 3, end=False)
    assert len(client.take()["submits"]) == 3
    assert client.h2.outbound_flow_control_window == before  # given back past 8 MiB
