"""The HTTP/1.1 server side of one connection, sans I/O: bytes and frames in, decisions out.

`H1Connection` parses with httptools and owns the connection's state (`h1_state.Conn`)
and its exchanges in request order. It never touches a socket, a loop or a router: what
it decides waits in its lists for the shell (`proxy/http.py`) to carry out, in this
order: `dispatch` (send to the route's router), `sends` (frames of a request's own
stream for its replica: a streamed upload's parts, a WebSocket's messages), `out` (bytes
to write), `cancels`, `acks` (streamed body bytes written: `Pending.consumed`),
`records` (metrics and access log; the deadline is disarmed unless the request runs on
detached), `settled` (a detached request ended: disarm its deadline), `rejections`
(counters); then close when `state` is CLOSED, and pause or resume reading as
`reading_paused` and `upload_paused` say; `reset` asks for that close to be a TCP reset
(the response that ends the connection is a stream cut by its deadline). `wake` tells
the shell there is something to do after a frame or failure the router delivered.

Each request's head is read once, when its headers are in (`head.read_head`). Requests
may be pipelined: at most MAX_PIPELINED are owed at a time; past that reading pauses,
and any read in the same bytes wait (QUEUED) before going to their router. A request
that cannot be read (malformed, too large, too slow) is answered and the connection
closed; CONNECT is refused.

A body larger than UPLOAD_STREAM_BYTES is not buffered: once that much is in, the
request goes to its router with what came so far and the rest follows as it arrives
(`Exchange.upload`), reading paused while the replica's window is shut
(`upload_paused`); smaller bodies travel whole in the request's one frame. A WebSocket
handshake to a route (`Upgrade: websocket`) makes the connection UPGRADED and its bytes
frames for its `WsExchange` (proxy/ws_exchange.py); any other Upgrade is served as plain
HTTP and then closed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import httptools

from surge.codecs.websocket import is_websocket_upgrade
from surge.proxy.exchange import Exchange, Outbox
from surge.proxy.h1_state import (
    CONNECTION,
    EXCHANGE,
    Conn,
    ConnEvent,
    H1StateError,
    Phase,
    PhaseEvent,
)
from surge.proxy.head import HeadFields, RequestHead, new_request_id, read_head
from surge.proxy.responses import CONTINUE, simple
from surge.proxy.site import Site
from surge.proxy.upstream import Upstream
from surge.proxy.ws_exchange import WsExchange

__all__ = ["MAX_PIPELINED", "UPLOAD_STREAM_BYTES", "H1Connection"]

# Requests one connection may have owed at once. Browsers do not pipeline and wrk's
# pipelining scripts send a handful; 16 keeps one client from holding more than 16 of
# a deployment's replica slots or queue places and bounds the responses held back
# behind a slow first one, while a pipelining client still never waits on us.
MAX_PIPELINED = 16
# A body up to this size travels whole with its request (one frame, the fast path); a
# larger one, or a chunked one that grows past it, streams to the app as it arrives, so
# an upload costs the proxy this much and a window, not its size.
UPLOAD_STREAM_BYTES = 256 * 1024

IDLE, HEADERS, BODY, CLOSING, CLOSED = (Conn.IDLE, Conn.HEADERS, Conn.BODY, Conn.CLOSING,
                                        Conn.CLOSED)
UPGRADED = Conn.UPGRADED
_READING = (IDLE, HEADERS, BODY)
DONE, QUEUED = Phase.DONE, Phase.QUEUED
_DISPATCHED = EXCHANGE[QUEUED][PhaseEvent.DISPATCH]
_BEGIN, _HEADERS_END, _END, _LAST = (ConnEvent.BEGIN, ConnEvent.HEADERS_END, ConnEvent.END,
                                     ConnEvent.LAST)
_REFUSE, _DECLINE, _CLOSE = ConnEvent.REFUSE, ConnEvent.DECLINE, ConnEvent.CLOSE
_IDLE_TIMEOUT, _LOST, _UPGRADE = ConnEvent.IDLE_TIMEOUT, ConnEvent.LOST, ConnEvent.UPGRADE
# surge_rejected_requests_total{reason} for requests refused before they reach a router.
REFUSAL_REASONS = {400: "malformed", 408: "header_timeout", 413: "body_too_large",
                   431: "headers_too_large"}
_WANTED = HeadFields.WANTED


_NO_HEAD = RequestHead.bare(b"-")


class _Stop(Exception):
    """Raised in a parser callback after refusing the request: stop parsing."""


def _nothing() -> None:
    pass


class H1Connection:
    __slots__ = ("_max_body", "_max_header", "acks", "body", "body_at", "body_size", "cancels",
                 "dispatch", "exchanges", "fields", "head", "header_bytes", "headers", "holding",
                 "idle_since", "out", "outbox", "parser", "reading_paused", "received_at",
                 "records", "rejections", "reset", "sends", "settled", "site", "started_at",
                 "state", "upload_paused", "uploading", "url", "wake", "writing_paused")

    def __init__(self, site: Site, wake: Callable[[], None] = _nothing) -> None:
        self.site = site
        self.wake = wake
        self._max_header = site.spec.max_header_bytes
        self._max_body = site.spec.max_body_bytes
        self.parser = httptools.HttpRequestParser(self)
        self.state = IDLE
        self.exchanges: deque[Exchange] = deque()  # owed responses, in request order
        # Decisions, for the shell: this connection's and its exchanges' (the same lists,
        # named here too for the shell)
        outbox = self.outbox = Outbox()
        self.dispatch = outbox.dispatch
        self.cancels = outbox.cancels
        self.out = outbox.out
        self.acks = outbox.acks
        self.sends = outbox.sends
        self.records = outbox.records
        self.settled = outbox.settled
        self.rejections = outbox.rejections
        self.reset = False  # once CLOSED: close with a TCP reset rather than a FIN
        self.reading_paused = False  # wanted: MAX_PIPELINED responses are owed
        self.writing_paused = False  # the transport's buffer is full: acknowledgements wait
        self.holding: list[Exchange] = []  # exchanges with acknowledgements held back
        self.uploading: Exchange | None = None  # its body (or WebSocket) streams to it
        self.upload_paused = False  # wanted: its replica's window is shut
        # The request being read:
        self.fields = HeadFields()
        self.head = _NO_HEAD  # the last request's, once its headers are in
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] | None = None
        self.body_size = 0
        self.header_bytes = 0
        self.received_at = 0.0  # when the bytes being parsed arrived (monotonic)
        self.started_at = 0.0  # its first byte
        self.body_at = 0.0  # its headers' end, or the body's last progress
        self.idle_since: float | None = site.now()  # None while a request is read or owed

    def __repr__(self) -> str:
        phases = ",".join(e.phase.value for e in self.exchanges)
        return (f"<H1Connection {self.state.value} exchanges=[{phases}] "
                f"reading_paused={self.reading_paused} writing_paused={self.writing_paused}>")

    # -- inputs from the shell -------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        state = self.state
        if state is CLOSING or state is CLOSED:
            return  # no further request is read: whatever follows is not ours to parse
        self.received_at = self.site.now()  # one clock read for all it holds
        if state is UPGRADED:
            self._frames(data)
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # on_message_complete decided: a WebSocket, plain HTTP, or CONNECT refused
            if self.state is UPGRADED and len(data) > exc.args[0]:
                self._frames(data[exc.args[0]:])
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, H1StateError):
                raise exc.__context__ from None
            if self.state in _READING:  # not already refused by a callback (_Stop)
                self._refuse(400, f"Malformed HTTP request: {exc}".encode())

    def decline(self, status: int, body: bytes, extra: tuple[tuple[bytes, bytes], ...],
                reason: str) -> None:
        """Refuse the connection before it says anything (over the connection cap)."""
        self.state = CONNECTION[self.state][_DECLINE]
        self.rejections.append(("", "", reason))
        self.out.append(simple(status, body, new_request_id(), False, extra=extra))

    def connection_lost(self) -> None:
        self.state = CONNECTION[self.state][_LOST]
        self._abandon()
        self._release()  # held bytes were written; no resume will come for them now

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._release()

    def check_time(self, now: float) -> None:
        """The sweeper's tick: close an idle connection; 408 to a slow request."""
        state = self.state
        spec = self.site.spec
        if state is IDLE:
            since = self.idle_since
            if (since is not None and now - since >= spec.keep_alive_timeout_s
                    and not self.exchanges):
                self.state = CONNECTION[state][_IDLE_TIMEOUT]
        elif state is HEADERS:
            timeout = spec.request_header_timeout_s
            if now - self.started_at >= timeout:  # slowloris
                self._refuse(408, f"Request headers not received within {timeout:g}s.".encode())
        elif state is UPGRADED:
            websocket = self.uploading
            if isinstance(websocket, WsExchange):
                websocket.idle(now, spec.websocket_idle_timeout_s)
        elif state is BODY:
            timeout = spec.request_body_timeout_s
            if self.upload_paused:
                self.body_at = now  # its app is slow, not its client: no 408 for that
            elif now - self.body_at >= timeout:  # truncated, or sent to hold the slot
                self._refuse(408, f"Request body stalled for {timeout:g}s.".encode(),
                             "body_timeout")

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.state = CONNECTION[self.state][_BEGIN]
        self.started_at = self.received_at
        self.idle_since = None
        self.url = b""
        self.headers = []
        self.body = None
        self.body_size = 0
        self.header_bytes = 0
        if self.fields.noted:
            self.fields.reset()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)
        if self.header_bytes > self._max_header:
            self._too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.headers.append((name, value))
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > self._max_header:
            self._too_large()
        if name in _WANTED:
            self.fields.note(name, value)

    def _too_large(self) -> None:
        self._refuse(431, f"Request line and headers exceed {self._max_header} bytes.".encode())
        raise _Stop

    def on_headers_complete(self) -> None:
        self.state = CONNECTION[self.state][_HEADERS_END]
        self.body_at = self.received_at
        parser = self.parser
        fields = self.fields
        self.head = read_head(parser.get_method(), self.url, parser.get_http_version(),
                              self.headers, fields, self.site)
        if fields.noted:  # a declared body, Expect: the checks below have work to do
            self._announced(fields)

    def _announced(self, fields: HeadFields) -> None:
        if fields.declared > self._max_body:
            self._refuse(413, f"Request body exceeds the limit of {self._max_body} "
                              "bytes.".encode())
            raise _Stop
        # A client that asked to hear "100 Continue" before sending its body (curl does
        # for bodies over 1 KiB) would otherwise wait a second for it. An interim
        # response may only go out when no earlier response is still owed, and a body
        # that will be refused is not invited (it is read and dropped).
        head = self.head
        if (head.expect_continue and fields.declared > 0 and not self.exchanges
                and head.http_version == "1.1"
                and (head.answer is None or head.answer.invites_body)):
            self.out.append(CONTINUE)

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        self.body_at = self.received_at
        if self.body_size > self._max_body:
            self._refuse(413, f"Request body exceeds the limit of {self._max_body} "
                              "bytes.".encode())
            raise _Stop
        if self.head.answer is None:  # else read and dropped
            uploading = self.uploading
            if uploading is not None:
                uploading.upload(body, True)
                return
            if self.body is None:
                self.body = [body]
            else:
                self.body.append(body)
            if self.body_size > UPLOAD_STREAM_BYTES:
                self._stream_upload()

    def on_message_complete(self) -> None:
        parser = self.parser
        head = self.head
        keep_alive = parser.should_keep_alive()
        if parser.should_upgrade():
            if head.method == "CONNECT":
                self._refuse(400, b"Protocol upgrades are not supported.")
                return
            key = is_websocket_upgrade(self.headers) if head.answer is None else None
            if key is not None and head.method == "GET":
                self._upgrade(key)
                return
            # Served as plain HTTP (RFC 9110 7.8 lets a server ignore Upgrade), then
            # closed: whatever follows is not HTTP.
            keep_alive = False
        self.state = CONNECTION[self.state][_END if keep_alive else _LAST]
        uploading = self.uploading
        if uploading is not None:  # the last of a streamed body
            self.uploading = None
            self.upload_paused = False
            uploading.keep_alive = keep_alive  # read in full: the connection may go on
            uploading.upload(b"", False)
            return
        parts = self.body
        body = b"" if parts is None else parts[0] if len(parts) == 1 else b"".join(parts)
        self._enqueue(Exchange(self, head, body, keep_alive, self.body_at))

    def _stream_upload(self) -> None:
        """The body outgrew UPLOAD_STREAM_BYTES: the request goes now, the rest follows."""
        parts = self.body
        assert parts is not None
        self.body = None
        # Until its body is in, a response ends the connection: the rest is unread.
        exchange = Exchange(self, self.head, b"".join(parts), False, self.body_at)
        exchange.upstream = Upstream()
        self.uploading = exchange
        self.upload_paused = True  # until the replica that takes it grants a window
        self._enqueue(exchange)

    def _upgrade(self, key: bytes) -> None:
        self.state = CONNECTION[self.state][_UPGRADE]
        exchange = WsExchange(self, self.head, key, self.site.spec.websocket_max_message_bytes,
                              self.body_at)
        self.uploading = exchange
        self.upload_paused = True  # until the app accepts
        self._enqueue(exchange)

    def _frames(self, data: bytes) -> None:
        websocket = self.uploading
        if isinstance(websocket, WsExchange):
            websocket.data_received(data, self.received_at)

    def close_now(self, exchange: Exchange) -> None:
        """A WebSocket closed before its handshake finished: give it up, and the rest."""
        try:
            self.exchanges.remove(exchange)
        except ValueError:
            pass
        exchange.gone()
        self.state = CONNECTION[self.state][_CLOSE]
        self._abandon()

    def _enqueue(self, exchange: Exchange) -> None:
        head = exchange.head
        exchanges = self.exchanges
        exchanges.append(exchange)
        owed = len(exchanges)
        if head.answer is not None:
            exchange.answer(head.answer)
        elif owed <= MAX_PIPELINED:
            exchange.phase = _DISPATCHED
            self.dispatch.append(exchange)
        if owed >= MAX_PIPELINED:
            self.reading_paused = True

    # -- helpers ---------------------------------------------------------------------------

    def _refuse(self, status: int, body: bytes, reason: str = "") -> None:
        """Answer a request that cannot be read, then close: the stream cannot be trusted."""
        uploading = self.uploading
        if uploading is not None:  # its request went ahead: it is the one refused
            self.uploading = None
            self.upload_paused = False
            self.state = CONNECTION[self.state][_REFUSE]
            self.rejections.append(("", "", reason or REFUSAL_REASONS.get(status, str(status))))
            uploading.refused(status, body)
            return
        state = self.state
        request_id = (self.head.request_id if state is BODY and self.head is not None
                      else self.fields.request_id if state is HEADERS else None)
        self.state = CONNECTION[state][_REFUSE]
        self.rejections.append(("", "", reason or REFUSAL_REASONS.get(status, str(status))))
        exchange = Exchange(self, RequestHead.bare(request_id or new_request_id()), b"", False,
                            self.site.now())
        self.exchanges.append(exchange)
        exchange.respond(status, body)

    # -- what its exchanges ask of it (exchange.Line) --------------------------------------

    def now(self) -> float:
        return self.site.now()

    def upload_window(self, exchange: Exchange, paused: bool) -> None:
        """The replica's window for `exchange`'s upload shut or opened: reading follows
        it while that upload is the one being read."""
        if self.uploading is exchange:
            self.upload_paused = paused

    def advance_line(self) -> None:
        """Pass the written responses at the head of the line; the next one's turn comes."""
        exchanges = self.exchanges
        while exchanges and exchanges[0].phase is DONE:
            written = exchanges.popleft()
            if not written.keep_alive:
                self.state = CONNECTION[self.state][_CLOSE]
                self.reset = written.reset
                self._abandon()  # nothing after a close can be answered
                return
            if exchanges:
                if len(exchanges) >= MAX_PIPELINED:  # one more fits the window now
                    entering = exchanges[MAX_PIPELINED - 1]
                    if entering.phase is QUEUED:
                        entering.dispatch()
                exchanges[0].flush()
        if not exchanges:
            self.reading_paused = False
            if self.state is IDLE:
                self.idle_since = self.site.now()
        elif self.reading_paused and len(exchanges) < MAX_PIPELINED:
            self.reading_paused = False

    def acknowledge(self, exchange: Exchange, nbytes: int) -> None:
        """`nbytes` of a streamed body reached the transport: the replica may send more."""
        if self.writing_paused:
            if not exchange.held:
                self.holding.append(exchange)
            exchange.held += nbytes
        else:
            self.acks.append((exchange, nbytes))

    def _release(self) -> None:
        for exchange in self.holding:
            self.acks.append((exchange, exchange.held))
            exchange.held = 0
        self.holding.clear()

    def _abandon(self) -> None:
        exchanges = self.exchanges
        while exchanges:
            exchanges.popleft().gone()
