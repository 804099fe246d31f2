"""The sans-IO core's request streams: WebSocket upgrades and streamed uploads.

A real client-side wsproto makes the client's (masked) frames and reads the proxy's;
the test plays the replica with frames, as in tests/proxy/test_h1.py.
"""

from __future__ import annotations

import base64
import hashlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, Pong, TextMessage

from surge.errors import ReplicaDiedError
from surge.proxy.exchange import Exchange
from surge.proxy.h1 import UPLOAD_STREAM_BYTES
from surge.proxy.h1_state import Conn, Phase
from surge.proxy.ws_exchange import WsExchange
from surge.testing import FakeClock
from surge.transport.flow import STREAM_WINDOW
from surge.transport.messages import (
    Credit,
    Failure,
    HttpBody,
    HttpStart,
    WsAccept,
    WsClose,
    WsData,
)
from tests.proxy.wire import Wire, make_site, parse, request

KEY = base64.b64encode(b"0123456789abcdef").decode()
HANDSHAKE = request("GET", "/app/chat", ("Upgrade", "websocket"), ("Connection", "Upgrade"),
                    ("Sec-WebSocket-Key", KEY), ("Sec-WebSocket-Version", "13"),
                    ("Sec-WebSocket-Protocol", "a, b"))


def opened(**limits: object) -> tuple[Wire, WsExchange, Connection, FakeClock]:
    clock = FakeClock()
    wire = Wire(make_site(clock=clock, **limits))
    wire.send(HANDSHAKE)
    exchange = wire.waiting[0]
    assert isinstance(exchange, WsExchange)
    assert wire.core.state is Conn.UPGRADED and wire.paused  # until the app accepts
    wire.frame(exchange, WsAccept(id=1, subprotocol="b", headers=[(b"x-app", b"1")]))
    wire.frame(exchange, Credit(id=1, amount=STREAM_WINDOW))
    assert not wire.paused
    return wire, exchange, Connection(ConnectionType.CLIENT), clock


def client_events(wire: Wire, client: Connection, since: int) -> list[object]:
    client.receive_data(bytes(wire.written[since:]))
    return list(client.events())


def after_head(wire: Wire) -> int:
    return bytes(wire.written).index(b"\r\n\r\n") + 4


def test_the_handshake_is_dispatched_and_answered_101_once_accepted() -> None:
    wire, exchange, _, _ = opened()
    head = parse(bytes(wire.written)[:after_head(wire)])[0]
    token = base64.b64encode(hashlib.sha1(
        KEY.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()).decode()
    assert head.status == 101
    assert head.headers["sec-websocket-accept"] == token
    assert head.headers["sec-websocket-protocol"] == "b"
    assert head.headers["x-app"] == "1" and head.headers["x-request-id"]
    assert exchange.phase is Phase.OPEN and exchange.status == 101


def test_messages_both_ways_with_acknowledgements_and_pongs() -> None:
    wire, exchange, client, _ = opened()
    start = after_head(wire)
    wire.send(client.send(TextMessage(data="hé")) + client.send(BytesMessage(data=b"\x00" * 9))
              + client.send(Ping(payload=b"p")))
    assert [f for _, f in wire.sends] == [WsData(id=0, data="hé".encode(), text=True),
                                         WsData(id=0, data=b"\x00" * 9)]
    wire.frame(exchange, WsData(id=1, data=b"back"))
    wire.frame(exchange, WsData(id=1, data=b"txt", text=True))
    events = client_events(wire, client, start)
    assert events == [Pong(payload=b"p"), BytesMessage(data=b"back"), TextMessage(data="txt")]
    assert wire.acked(exchange) == 7  # the app's payload bytes, once written


def test_fragments_are_joined_into_one_message() -> None:
    wire, _, client, _ = opened()
    wire.send(client.send(TextMessage(data="ab", message_finished=False)))
    assert wire.sends == []
    wire.send(client.send(TextMessage(data="cd", message_finished=True)))
    assert [f for _, f in wire.sends] == [WsData(id=0, data=b"abcd", text=True)]


def test_the_clients_messages_wait_for_the_replicas_window() -> None:
    wire, exchange, client, _ = opened()
    big = b"x" * STREAM_WINDOW
    wire.send(client.send(BytesMessage(data=big)) + client.send(BytesMessage(data=b"y")))
    assert len(wire.sends) == 1 and wire.paused  # the window is spent: reading stops
    wire.frame(exchange, Credit(id=1, amount=STREAM_WINDOW))
    assert [f.data for _, f in wire.sends][1:] == [b"y"] and not wire.paused


def test_the_clients_close_reaches_the_app_and_ends_the_connection() -> None:
    wire, exchange, client, _ = opened()
    start = after_head(wire)
    wire.send(client.send(CloseConnection(code=4002, reason="bye")))
    assert wire.sends[-1][1] == WsClose(id=0, code=4002, reason="bye")
    assert client_events(wire, client, start) == [CloseConnection(code=4002, reason="bye")]
    assert wire.closed and exchange.phase is Phase.DONE
    wire.frame(exchange, WsData(id=1, data=b"late"))  # dropped after the close
    wire.frame(exchange, WsClose(id=1, code=1000))
    assert wire.after_close == b""


def test_the_apps_close_code_reaches_the_client() -> None:
    wire, exchange, client, _ = opened()
    start = after_head(wire)
    wire.frame(exchange, WsClose(id=1, code=4001, reason="done"))
    assert client_events(wire, client, start) == [CloseConnection(code=4001, reason="done")]
    assert wire.closed and exchange.close_code == 4001 and wire.records == [exchange]


def test_a_message_over_the_limit_closes_with_1009_both_ways() -> None:
    wire, _, client, _ = opened(websocket_max_message_bytes=100)
    start = after_head(wire)
    wire.send(client.send(BytesMessage(data=b"z" * 101)))
    assert [f for _, f in wire.sends] == [WsClose(id=0, code=1009, reason="message too big")]
    assert client_events(wire, client, start)[0] == CloseConnection(code=1009,
                                                                    reason="message too big")
    assert wire.closed


def test_an_idle_socket_closes_with_1001() -> None:
    wire, _, client, clock = opened(websocket_idle_timeout_s=10.0)
    clock.advance(9.0)
    wire.send(client.send(TextMessage(data="still here")))
    clock.advance(9.0)
    wire.core.check_time(clock.monotonic())
    assert not wire.closed
    clock.advance(1.0)
    wire.core.check_time(clock.monotonic())
    wire.collect()
    assert wire.closed and wire.sends[-1][1] == WsClose(id=0, code=1001, reason="idle timeout")


def test_going_away_closes_with_1001_both_ways() -> None:
    wire, exchange, client, _ = opened()
    start = after_head(wire)
    exchange.going_away("proxy shutting down")
    wire.collect()
    assert client_events(wire, client, start) == [CloseConnection(
        code=1001, reason="proxy shutting down")]
    assert wire.sends[-1][1] == WsClose(id=0, code=1001, reason="proxy shutting down")
    assert wire.closed


def test_a_dead_replica_closes_the_client_with_1011() -> None:
    wire, exchange, client, _ = opened()
    start = after_head(wire)
    exchange.on_failure(ReplicaDiedError("replica r died"))
    wire.collect()
    assert client_events(wire, client, start) == [CloseConnection(code=1011,
                                                                  reason="replica died")]
    assert wire.closed


def test_a_failed_app_task_closes_with_1011() -> None:
    wire, exchange, client, _ = opened()
    start = after_head(wire)
    wire.frame(exchange, Failure(id=1, kind="cancelled", message="x"))
    assert client_events(wire, client, start)[0].code == 1011  # type: ignore[attr-defined]


def test_a_vanished_client_is_a_1006_for_the_app() -> None:
    wire, exchange, _, _ = opened()
    wire.core.connection_lost()
    wire.collect()
    assert wire.sends[-1] == (exchange, WsClose(id=0, code=1006))
    assert exchange.phase is Phase.DONE and not wire.cancelled  # the app hears it; no cancel


def test_a_denial_before_the_accept_is_an_http_answer() -> None:
    wire = Wire()
    wire.send(HANDSHAKE)
    exchange = wire.waiting[0]
    wire.frame(exchange, HttpStart(id=1, status=403, headers=[], body=b"", more=False))
    assert [r.status for r in wire.responses()] == [403] and wire.closed


def test_overload_before_the_upgrade_is_a_503_and_a_close() -> None:
    from surge.errors import BackPressureError

    wire = Wire()
    wire.send(HANDSHAKE)
    exchange = wire.waiting.pop()
    exchange.on_failure(BackPressureError(deployment="d", num_queued_requests=1,
                                          max_queued_requests=1, retry_after_s=1.0))
    wire.collect()
    assert [r.status for r in wire.responses()] == [503] and wire.closed


def test_a_close_before_the_accept_gives_the_request_up() -> None:
    wire = Wire()
    client = Connection(ConnectionType.CLIENT)
    wire.send(HANDSHAKE + client.send(CloseConnection(code=1000)))
    assert [type(e) for e in wire.cancelled] == [WsExchange] and wire.closed
    assert wire.cancelled[0].status == 499 and wire.written == b""


def test_a_websocket_is_never_detached_from_its_client() -> None:
    wire = Wire()
    wire.send(HANDSHAKE.replace(b"\r\n\r\n", b"\r\nx-request-disconnect-disabled: ?1\r\n\r\n"))
    exchange = wire.waiting[0]
    wire.core.connection_lost()
    wire.collect()
    assert exchange.phase is Phase.ABANDONED and wire.cancelled == [exchange]


def test_the_request_timeout_covers_only_the_wait_for_the_accept() -> None:
    wire, exchange, _, _ = opened()
    exchange.timed_out(5.0)
    wire.collect()
    assert exchange.phase is Phase.OPEN and not wire.cancelled


def test_an_upgrade_that_is_not_a_websocket_is_plain_http() -> None:
    wire = Wire()
    wire.send(request("GET", "/app", ("Upgrade", "h2c"), ("Connection", "Upgrade")))
    exchange = wire.waiting[0]
    assert type(exchange) is Exchange
    wire.reply(exchange)
    assert [r.status for r in wire.responses()] == [200] and wire.closed


# -- streamed uploads ----------------------------------------------------------------------

BIG = 10 * UPLOAD_STREAM_BYTES


def upload_head(length: int = BIG) -> bytes:
    return request("POST", "/app", ("Content-Length", str(length)))


def test_a_small_body_travels_whole() -> None:
    wire = Wire(make_site(max_body_bytes=BIG))
    wire.send(request("POST", "/app", body=b"s" * UPLOAD_STREAM_BYTES))
    exchange = wire.waiting[0]
    assert exchange.upstream is None and len(exchange.body) == UPLOAD_STREAM_BYTES


def test_a_large_body_streams_under_the_replicas_window() -> None:
    wire = Wire(make_site(max_body_bytes=BIG))
    part = b"p" * (UPLOAD_STREAM_BYTES + 1)
    wire.send(upload_head() + part)
    exchange = wire.waiting[0]
    assert exchange.upstream is not None and exchange.body == part
    assert wire.paused and not exchange.keep_alive  # until a replica grants room
    rest = b"r" * (BIG - len(part))
    wire.send(rest[:100_000])
    wire.send(rest[100_000:])  # held back: reading is paused
    assert wire.sends == [] and wire.held
    wire.frame(exchange, Credit(id=1, amount=STREAM_WINDOW))
    sent = [f for _, f in wire.sends]
    assert all(isinstance(f, HttpBody) for f in sent) and sent[0].body == rest[:100_000]
    while wire.held or exchange.upstream.queue:
        wire.frame(exchange, Credit(id=1, amount=STREAM_WINDOW))
    bodies = [f for _, f in wire.sends]
    assert b"".join(f.body for f in bodies) == rest  # type: ignore[union-attr]
    assert bodies[-1] == HttpBody(id=0, body=b"", more=False)
    assert exchange.keep_alive and wire.core.uploading is None  # read in full
    wire.reply(exchange)
    assert not wire.closed  # the connection goes on


def test_a_paused_upload_is_not_a_stalled_one() -> None:
    clock = FakeClock()
    wire = Wire(make_site(clock=clock, max_body_bytes=BIG, request_body_timeout_s=3.0))
    wire.send(upload_head() + b"p" * (UPLOAD_STREAM_BYTES + 1))
    for _ in range(5):
        clock.advance(2.0)
        wire.core.check_time(clock.monotonic())
    wire.collect()
    assert wire.responses() == [] and not wire.closed
    exchange = wire.waiting[0]
    wire.frame(exchange, Credit(id=1, amount=STREAM_WINDOW))  # now the client is slow
    clock.advance(3.0)
    wire.core.check_time(clock.monotonic())
    wire.collect()
    assert [r.status for r in wire.responses()] == [408] and wire.cancelled == [exchange]


def test_a_streamed_body_over_the_limit_is_refused_and_stopped() -> None:
    wire = Wire(make_site(max_body_bytes=UPLOAD_STREAM_BYTES * 2))
    wire.send(request("POST", "/app", ("Transfer-Encoding", "chunked")))
    chunk = b"c" * UPLOAD_STREAM_BYTES
    wire.send(b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2)
    exchange = wire.waiting[0]
    wire.frame(exchange, Credit(id=1, amount=STREAM_WINDOW))
    wire.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    assert [r.status for r in wire.responses()] == [413]
    assert wire.cancelled == [exchange] and wire.closed


def test_an_answer_before_the_upload_ends_closes_the_connection() -> None:
    wire = Wire(make_site(max_body_bytes=BIG))
    wire.send(upload_head() + b"p" * (UPLOAD_STREAM_BYTES + 1))
    exchange = wire.waiting[0]
    wire.reply(exchange, b"early")
    assert [r.body for r in wire.responses()] == [b"early"] and wire.closed
    assert not wire.paused or wire.closed


def test_a_detached_upload_ignores_credit_and_settles_on_its_answer() -> None:
    wire = Wire(make_site(max_body_bytes=BIG))
    wire.send(request("POST", "/app", ("Content-Length", str(BIG)),
                      ("x-request-disconnect-disabled", "?1")) + b"p" * (UPLOAD_STREAM_BYTES + 1))
    exchange = wire.waiting[0]
    wire.core.connection_lost()
    wire.collect()
    assert exchange.phase is Phase.DETACHED
    wire.frame(exchange, Credit(id=1, amount=STREAM_WINDOW))
    assert exchange.phase is Phase.DETACHED and wire.settled == []
    wire.frame(exchange, HttpStart(id=1, status=200, headers=[], body=b"", more=False))
    assert exchange.phase is Phase.ABANDONED and wire.settled == [exchange]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=300), st.binary(max_size=3000)), max_size=8),
       st.lists(st.integers(1, 4000), max_size=12), st.booleans())
def test_any_split_of_the_clients_frames_gives_its_messages(
        messages: list[str | bytes], cuts: list[int], fragment: bool) -> None:
    wire, _, client, _ = opened()
    data = b""
    for message in messages:
        half = len(message) // 2
        parts = [message[:half], message[half:]] if fragment and half else [message]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            event = (TextMessage(data=part, message_finished=last) if isinstance(part, str)
                     else BytesMessage(data=part, message_finished=last))
            data += client.send(event)
    position = 0
    for cut in sorted(cuts):
        if position < cut < len(data):
            wire.send(data[position:cut])
            position = cut
    wire.send(data[position:])
    expected = [WsData(id=0, data=m.encode(), text=True) if isinstance(m, str)
                else WsData(id=0, data=m) for m in messages]
    assert [f for _, f in wire.sends] == expected


def test_a_handshake_without_its_token_is_a_401_and_never_upgrades() -> None:
    wire = Wire(make_site("/app", locked=("/app",)))
    wire.send(HANDSHAKE)
    assert wire.waiting == [] and wire.core.state is not Conn.UPGRADED
    assert [r.status for r in wire.responses()] == [401] and wire.closed
