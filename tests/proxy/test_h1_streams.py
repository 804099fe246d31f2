"""Any byte stream: exactly one response per request, in order, or a clean close.

Hypothesis draws a conversation: pipelined requests of every shape (bodies by length or
chunked, HEAD, HTTP/1.0, Expect, built-in paths, unknown paths), maybe a last request
that closes, maybe garbage, maybe a request cut short; it splits the bytes anywhere,
answers the requests that reach a router in any order and any way (one frame, a stream,
a failure, overload) and pauses writing at random. Whatever it draws, a client reading
the bytes gets one complete response per request it sent, in its order, with its id;
the connection closes after a closing request or the 400 for garbage, and nothing is
written after the close; every streamed byte written is acknowledged exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surge.errors import BackPressureError
from surge.proxy.exchange import Exchange
from surge.transport.messages import Failure
from tests.proxy.wire import Wire, make_site, parse


@dataclass(frozen=True)
class Sent:
    data: bytes
    head: bool  # a HEAD request: its response has no body
    closes: bool  # the last request the connection reads


@st.composite
def requests(draw: st.DrawFn, index: int) -> Sent:
    method = draw(st.sampled_from(["GET", "GET", "POST", "HEAD"]))
    path = draw(st.sampled_from(["/app", "/app/x?y=1", "/-/healthz", "/nowhere", "/app/%7E"]))
    version = draw(st.sampled_from(["1.1"] * 9 + ["1.0"]))
    lines = [f"{method} {path} HTTP/{version}", "Host: x", f"X-Request-Id: q{index}"]
    closes = version == "1.0"
    if version == "1.0" and draw(st.booleans()):
        lines.append("Connection: keep-alive")
        closes = False
    elif version == "1.1" and draw(st.integers(0, 9)) == 0:
        lines.append("Connection: close")
        closes = True
    body = b""
    if method == "POST":
        payload = draw(st.binary(max_size=40))
        if draw(st.booleans()) or version == "1.0":
            lines.append(f"Content-Length: {len(payload)}")
            body = payload
        else:
            lines.append("Transfer-Encoding: chunked")
            body = (b"%x\r\n%s\r\n" % (len(payload), payload) if payload else b"") + b"0\r\n\r\n"
        if draw(st.booleans()):
            lines.append("Expect: 100-continue")
    return Sent(("\r\n".join(lines) + "\r\n\r\n").encode() + body, method == "HEAD", closes)


GARBAGE = st.sampled_from([b"\x00GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
                           b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"])
ANSWERS = st.sampled_from(["one", "one", "stream", "failure", "busy"])


def answer(w: Wire, exchange: Exchange, how: str, closing: set[bytes]) -> None:
    head = exchange.head
    if how == "stream" and head.http_10 and not head.head_only:
        closing.add(head.request_id)  # no chunks in HTTP/1.0: the close ends the body
    if how == "one":
        w.reply(exchange, b"body of " + exchange.head.request_id)
    elif how == "stream":
        w.stream(exchange, b"a", b"bb", b"ccc")
    else:
        w.waiting.remove(exchange)
        if how == "failure":
            exchange.deliver(Failure(id=1, kind="user", message="x"))
        else:
            exchange.fail(BackPressureError(deployment="d", num_queued_requests=1,
                                            max_queued_requests=1, retry_after_s=1.0))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_one_response_per_request_in_order_or_a_clean_close(data: st.DataObject) -> None:
    count = data.draw(st.integers(0, 24), label="requests")
    sent = [data.draw(requests(i)) for i in range(count)]
    tail = data.draw(st.sampled_from(["", "garbage", "cut"]), label="tail")
    stream = b"".join(s.data for s in sent)
    if tail == "garbage":
        stream += data.draw(GARBAGE)
    elif tail == "cut":
        stream += b"GET /app HTTP/1.1\r\nHost: x\r\nX-Requ"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts"))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    w = Wire(make_site("/app"))
    closing: set[bytes] = set()
    for piece in pieces:
        if data.draw(st.booleans(), label="toggle writing"):
            if w.core.writing_paused:
                w.core.resume_writing()
            else:
                w.core.pause_writing()
            w.collect()
        w.send(piece)
        while w.waiting and data.draw(st.booleans(), label="answer one now"):
            picked = data.draw(st.sampled_from(w.waiting))
            answer(w, picked, data.draw(ANSWERS), closing)
    w.core.resume_writing()
    w.collect()
    while w.waiting:
        answer(w, w.waiting[0], data.draw(ANSWERS), closing)

    # What the client should get: every request up to the first that closes...
    expected = []
    for index, s in enumerate(sent):
        expected.append(s)
        if s.closes or f"q{index}".encode() in closing:
            break
    refused = tail == "garbage" and len(expected) == len(sent) and not (
        any(s.closes for s in sent) or closing)
    heads = tuple(i for i, s in enumerate(expected) if s.head)
    responses = [r for r in w.responses(head=heads) if r.status != 100]
    assert [r.request_id for r in responses[:len(expected)]] == [
        f"q{i}" for i in range(len(expected))]
    assert all(r.complete for r in responses)
    if refused:  # ...and the 400 for the garbage
        assert len(responses) == len(expected) + 1 and responses[-1].status == 400
    else:
        assert len(responses) == len(expected)
    closes = refused or any(s.closes for s in expected) or bool(closing)
    assert w.closed is closes
    if not closes:  # an open connection is idle (or reading the request cut short)
        w.core.connection_lost()
        w.collect()
    assert w.after_close == b"" and not w.core.exchanges
    streamed: dict[int, int] = {}
    for exchange, nbytes in w.acks:
        streamed[id(exchange)] = streamed.get(id(exchange), 0) + nbytes
    assert all(n == 6 for n in streamed.values())  # "a" + "bb" + "ccc", once each


FRAGMENTS = st.sampled_from([b"GET /app HTTP/1.1\r\n", b"POST /app HTTP/1.0\r\n", b"Host: x\r\n",
                             b"Content-Length: 3\r\n", b"Transfer-Encoding: chunked\r\n",
                             b"Connection: close\r\n", b"Expect: 100-continue\r\n", b"\r\n",
                             b"3\r\nabc\r\n", b"0\r\n\r\n", b"HEAD /-/healthz HTTP/1.1\r\n",
                             b"Upgrade: x\r\nConnection: upgrade\r\n"])


@settings(max_examples=300, deadline=None)
@given(st.lists(FRAGMENTS | st.binary(max_size=12), max_size=30), st.data())
def test_any_bytes_get_whole_responses_for_what_was_read_or_a_clean_close(
        parts: list[bytes], data: st.DataObject) -> None:
    w = Wire(make_site("/app"))
    for part in parts:
        w.send(part)
        while w.waiting:
            answer(w, w.waiting[0], data.draw(ANSWERS), set())
    answered = [e for e in w.records if e.status != 499]
    heads = {e.head.request_id.decode() for e in answered if e.head.head_only}
    responses = [r for r in parse(bytes(w.written), heads) if r.status != 100]
    # One whole response per request that got one (order: the test above, with its ids).
    assert sorted(r.request_id for r in responses) == sorted(
        e.head.request_id.decode() for e in answered)
    assert all(r.complete for r in responses)
    w.core.connection_lost()
    w.collect()
    assert w.after_close == b"" and not w.core.exchanges and not w.waiting


