"""The proxy's share of flow control: pipelining depth and the client socket's backpressure."""

from __future__ import annotations

from surge.proxy.h1 import MAX_PIPELINED
from surge.proxy.h1_state import Phase
from surge.transport.messages import HttpBody
from tests.proxy.wire import Wire, request


def test_past_the_pipelining_depth_reading_pauses_and_requests_wait_their_turn() -> None:
    w = Wire()
    w.send(b"".join(request("GET", "/app", ("x-request-id", f"r{i}"))
                    for i in range(MAX_PIPELINED + 4)))
    assert len(w.waiting) == MAX_PIPELINED  # at the routers: never more than the depth
    assert w.paused  # the transport was asked to stop reading
    queued = list(w.core.exchanges)[MAX_PIPELINED:]
    assert [e.phase for e in queued] == [Phase.QUEUED] * 4
    w.send(request("GET", "/app", ("x-request-id", "later")))  # held, as a paused socket would
    assert len(w.core.exchanges) == MAX_PIPELINED + 4
    w.reply(w.waiting[1])  # not first in line: nothing moves
    assert len(w.waiting) == MAX_PIPELINED - 1 and w.paused
    w.reply(w.waiting[0])  # two written: two more go to their router
    assert len(w.waiting) == MAX_PIPELINED and queued[0].phase is Phase.WAITING
    assert queued[1].phase is Phase.WAITING and queued[2].phase is Phase.QUEUED
    assert w.paused  # still 18 owed
    while w.waiting:
        w.reply(w.waiting[0])
    ids = [r.request_id for r in w.responses()]
    assert ids == [f"r{i}" for i in range(MAX_PIPELINED + 4)] + ["later"]
    assert not w.paused and not w.core.exchanges


def test_reading_resumes_below_the_depth() -> None:
    w = Wire()
    w.send(b"".join(request() for _ in range(MAX_PIPELINED)))
    assert w.paused
    w.reply(w.waiting[0])
    assert not w.paused and len(w.core.exchanges) == MAX_PIPELINED - 1


def test_while_writing_is_paused_acknowledgements_wait_for_resume() -> None:
    w = Wire()
    w.send(request() + request())
    first, _second = w.waiting
    w.core.pause_writing()
    w.stream(first, b"12345", b"678", end=False)
    assert bytes(w.written).endswith(b"3\r\n678\r\n")  # still written: the transport buffers
    assert w.acks == [] and first.held == 8  # ...but the replica is not told to send more
    w.core.resume_writing()
    w.collect()
    assert w.acks == [(first, 8)] and first.held == 0
    first.deliver(HttpBody(id=1, body=b"9", more=True))
    assert w.acks[-1] == (first, 1)  # not paused: at once


def test_bytes_written_while_paused_are_acknowledged_even_when_the_stream_has_ended() -> None:
    w = Wire()
    w.send(request() + request())
    first, second = w.waiting
    w.stream(second, b"beh", b"ind")  # buffered: not written, not acknowledged
    w.core.pause_writing()
    w.stream(first, b"ab", b"cd")  # ends while paused; second's turn comes, it is written
    assert w.acks == [] and (first.held, second.held) == (4, 6)
    w.core.resume_writing()
    w.collect()
    assert sorted(n for _, n in w.acks) == [4, 6]
    assert [r.body for r in w.responses()] == [b"abcd", b"behind"]


def test_a_lost_connection_releases_what_was_held() -> None:
    w = Wire()
    w.send(request())
    [exchange] = w.waiting
    w.core.pause_writing()
    w.stream(exchange, b"abc", end=False)
    w.core.connection_lost()
    w.collect()
    assert w.acks == [(exchange, 3)] and exchange.phase is Phase.ABANDONED
