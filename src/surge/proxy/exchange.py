"""One exchange: a request on a connection and its response; the router's sink for it.

Response frames become HTTP/1.1 bytes here, and failures status codes (503 for overload,
with Retry-After when the rejection advises one; 408 for a deadline, 500 for a dead
replica, 499 for a cancel; with OpenAI's JSON error body on `/v1/...` paths). Bytes go to
the connection's output at once when the exchange is first in line, else wait in its
buffer until the responses before it are written: responses leave in request order.
Every phase change goes through `h1_state.EXCHANGE`.

HEAD and 1xx/204/304 responses carry no body (a stream's is stopped: it may never end);
an HTTP/1.0 client gets a streamed body unframed, ended by the close.

Flow control: each body byte of a streamed response (`HttpStart(more=True)` and its
`HttpBody` frames) that reaches the client's transport is acknowledged through the
connection (`H1Connection.acknowledge`, performed as `Pending.consumed`): at once, or,
while the transport has paused writing, when it resumes. A single-frame response never
is. The other way, a streamed upload's body parts wait in the exchange's `Upstream`
(proxy/upstream.py) until the replica grants room for them (`Credit`). Nothing here
performs I/O: decisions go to the connection's `Outbox`, what only the connection
decides (the responses' order, the upload's window) is asked of it (`Line`), and
`deliver` and `fail` (the Sink the router calls) then wake the shell to carry them out.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Protocol

from surge.errors import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaDiedError,
    RequestCancelledError,
)
from surge.policy.admission import retry_after_header
from surge.proxy.h1_state import EXCHANGE, H1StateError, Phase, PhaseEvent
from surge.proxy.head import TEXT, Answer, RequestHead
from surge.proxy.responses import LAST_CHUNK, chunk, forbids_body, head, openai_error, simple
from surge.proxy.upstream import Upstream
from surge.transport.messages import Credit, Failure, HttpBody, HttpStart, Message

__all__ = ["Exchange", "Line", "Outbox"]

JSON = b"application/json"

log = logging.getLogger("surge.proxy")

QUEUED, WAITING, STREAMING = Phase.QUEUED, Phase.WAITING, Phase.STREAMING
DONE, DETACHED, ABANDONED = Phase.DONE, Phase.DETACHED, Phase.ABANDONED
_DISPATCH, _STREAM, _BODY, _END = (PhaseEvent.DISPATCH, PhaseEvent.STREAM, PhaseEvent.BODY,
                                   PhaseEvent.END)
_CUT, _GONE, _DETACH = PhaseEvent.CUT, PhaseEvent.GONE, PhaseEvent.DETACH
_FRAME, _SETTLE = PhaseEvent.FRAME, PhaseEvent.SETTLE


class Outbox:
    """What a connection's exchanges decided, for the shell (proxy/http.py) to carry out;
    H1Connection's docstring gives the order. The connection makes one and hands it to
    each exchange: an exchange writes its decisions here, never into its connection."""

    __slots__ = ("acks", "cancels", "dispatch", "out", "records", "rejections", "sends",
                 "settled")

    def __init__(self) -> None:
        self.dispatch: list[Exchange] = []
        self.sends: list[tuple[Exchange, Message]] = []
        self.out: list[bytes] = []
        self.cancels: list[Exchange] = []
        self.acks: list[tuple[Exchange, int]] = []
        self.records: list[Exchange] = []
        self.settled: list[Exchange] = []
        self.rejections: list[tuple[str, str, str]] = []  # (app, deployment, reason)


class Line(Protocol):
    """What an exchange asks of its connection (proxy/h1.py's H1Connection), which keeps
    the responses' order and the upload's window: the connection decides those."""

    @property
    def outbox(self) -> Outbox: ...

    def wake(self) -> None: ...

    def now(self) -> float: ...

    @property
    def exchanges(self) -> deque[Exchange]:
        """The responses owed, in request order: the first is the one being written (read
        at every chunk written, so an attribute, not a call)."""
        ...

    def advance_line(self) -> None: ...

    def acknowledge(self, exchange: Exchange, nbytes: int) -> None: ...

    def upload_window(self, exchange: Exchange, paused: bool) -> None: ...

    def close_now(self, exchange: Exchange) -> None: ...


class Exchange:
    """One request/response on a connection."""

    __slots__ = ("body", "buffer", "buffered", "head", "held", "keep_alive", "line", "outbox",
                 "pending", "phase", "reset", "started", "status", "timer", "upstream")

    def __init__(self, line: Line, head: RequestHead, body: bytes, keep_alive: bool,
                 started: float) -> None:
        self.line = line
        self.outbox = line.outbox
        self.head = head
        self.body = body  # the request body, for the router
        self.keep_alive = keep_alive  # False: the connection closes after this response
        self.reset = False  # True: that close is a TCP reset (a stream that ran out of time)
        self.started = started  # when the request was in (monotonic), for its latency
        self.phase = QUEUED
        self.status = 0  # the status it got (499: its client went away)
        self.buffer: list[bytes] | None = None  # bytes waiting for earlier responses
        self.buffered = 0  # streamed body bytes in `buffer`: acknowledged once written
        self.held = 0  # streamed body bytes written while the transport was paused
        self.pending: Any = None  # the shell's: its Pending at the router
        self.timer: Any = None  # the shell's: its deadline
        self.upstream: Upstream | None = None  # a streamed upload's parts yet to send

    def __repr__(self) -> str:
        head = self.head
        return (f"<Exchange {head.method} {head.path!r} {self.phase.value} status={self.status} "
                f"keep_alive={self.keep_alive} buffered={len(self.buffer or ())} "
                f"held={self.held}>")

    # -- the Sink the router calls ---------------------------------------------------------

    # A frame or failure the tables do not allow here is a bug in surge, never a client's
    # doing. It is logged with the exchange's state and dropped: raised into the router it
    # would close the replica link that every other request on it shares.

    def deliver(self, message: Message) -> None:
        try:
            self.on_frame(message)
        except H1StateError:
            log.exception("dropped %s for %r", type(message).__name__, self)
        self.line.wake()

    def fail(self, exc: BaseException) -> None:
        try:
            self.on_failure(exc)
        except H1StateError:
            log.exception("dropped the failure %r for %r", exc, self)
        self.line.wake()

    # -- decisions -------------------------------------------------------------------------

    def dispatch(self) -> None:
        self.phase = EXCHANGE[self.phase][_DISPATCH]
        self.outbox.dispatch.append(self)

    def on_frame(self, message: Message) -> None:
        if self.phase is DETACHED:
            if not isinstance(message, Credit):  # room for an upload nobody sends: moot
                self._dropped(message)
            return
        if isinstance(message, HttpStart):
            self._start(message)
        elif isinstance(message, HttpBody):
            self._body(message)
        elif isinstance(message, Failure):
            if self.phase is STREAMING:  # the head is out; all we can do is cut the stream
                self._cut()
            elif message.kind == "cancelled":
                self.error(499, "Request cancelled.")
            else:
                self.error(500, "Internal Server Error")
        elif isinstance(message, Credit):
            self.credit(message.amount)
        else:
            raise H1StateError(f"an HTTP exchange cannot take {type(message).__name__}")

    def on_failure(self, exc: BaseException) -> None:
        phase = self.phase
        if phase is DETACHED:
            self._settle()
        elif phase is STREAMING:
            self._cut()
        elif isinstance(exc, BackPressureError):  # 503, or 429 by backpressure_config
            advice = ((b"retry-after", retry_after_header(exc.retry_after_s).encode()),)
            self.error(exc.status_code, str(exc), advice if exc.advise_retry else ())
        elif isinstance(exc, DeploymentUnavailableError):
            app, deployment, _ = self.head.labels
            self.outbox.rejections.append((app, deployment, "unavailable"))
            self.error(503, str(exc))  # no Retry-After, as Ray's: retrying will not help
        elif isinstance(exc, ReplicaDiedError):
            self.error(500, f"{exc}; the request may or may not have run.")
        elif isinstance(exc, RequestCancelledError):
            self.error(499, "Request cancelled.")
        else:
            log.error("request %s failed: %r", self.head.request_id.decode(), exc)
            self.error(500, "Internal Server Error")

    def timed_out(self, timeout_s: float) -> None:
        """Its deadline passed: stop it at the router; 408, or reset a stream's connection.

        A stream whose head is out can only be cut. Ray Serve's proxy resets the
        connection there, so a client's read fails as a broken connection ("Connection
        broken: ConnectionResetError" in `requests`), not as a body that ended early."""
        phase = self.phase
        if phase is WAITING:
            self.error(408, f"Request timed out after {timeout_s:g}s.")
        elif phase is STREAMING:
            self.reset = True
            self._cut()
        else:
            self._settle()  # detached: its client is gone, its deadline holds
        self.outbox.cancels.append(self)

    def gone(self) -> None:
        """The client went away: cancel the request wherever it is (logged as 499)."""
        phase = self.phase
        if phase is DONE:
            self.phase = EXCHANGE[phase][_GONE]  # answered: nothing changes
            return
        detach = self.head.detached and phase is not QUEUED
        self.phase = EXCHANGE[phase][_DETACH if detach else _GONE]
        self.status = 499  # logged and counted as 499, as Ray Serve does
        outbox = self.outbox
        outbox.records.append(self)
        if not detach and phase is not QUEUED:  # a detached one runs on, to its deadline
            outbox.cancels.append(self)

    def answer(self, answer: Answer) -> None:
        if answer.reason:
            self.outbox.rejections.append(("", "", answer.reason))
        self.respond(answer.status, answer.body, answer.extra, answer.content_type)

    def error(self, status: int, message: str,
              extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """An error of the proxy's own: plain text, as Ray Serve's proxy, except on an
        OpenAI API path (`/v1/...` under the route's prefix), whose clients expect
        OpenAI's JSON error body."""
        prefix = self.head.labels[2].rstrip("/")
        if self.head.path.startswith(prefix + "/v1/"):
            self.respond(status, openai_error(status, message), extra, JSON)
        else:
            self.respond(status, message.encode(), extra)

    def respond(self, status: int, body: bytes, extra: tuple[tuple[bytes, bytes], ...] = (),
                content_type: bytes = TEXT) -> None:
        """Answer in full with a response of the proxy's own."""
        self.phase = EXCHANGE[self.phase][_END]
        self.status = status
        head = self.head
        self._write(simple(status, body, head.request_id, self.keep_alive, content_type, extra,
                           http_10=head.http_10, head_only=head.head_only))
        self._finish()

    def _start(self, message: HttpStart) -> None:
        status = self.status = message.status
        request = self.head
        http_10 = request.http_10
        if not message.more:  # the usual: the whole answer in one frame
            self.phase = EXCHANGE[self.phase][_END]
            body = message.body
            data = head(status, message.headers, request.request_id, len(body), self.keep_alive,
                        True, http_10)
            if body and not (request.head_only or forbids_body(status)):
                data += body
            if self.upstream is not None:
                self._stop_upload()
            self.outbox.records.append(self)
            if self.line.exchanges[0] is self:
                self.outbox.out.append(data)
                self.line.advance_line()
            else:
                self.buffer = [data]  # nothing of it was written before: this is all
        elif request.head_only or forbids_body(status):
            # HEAD (or 204/304) of a stream: the head is the whole answer. Stop the stream
            # rather than wait for it: it may never end (server-sent events).
            self.phase = EXCHANGE[self.phase][_END]
            self._write(head(status, message.headers, request.request_id, None, self.keep_alive,
                             not http_10, http_10))
            self.outbox.cancels.append(self)
            self._finish()
        else:
            self.phase = EXCHANGE[self.phase][_STREAM]
            if http_10:
                self.keep_alive = False  # HTTP/1.0 has no chunks: the close ends the body
            data = head(status, message.headers, request.request_id, None, self.keep_alive,
                        not http_10, http_10)
            body = message.body
            if body:
                self._write(data + (body if http_10 else chunk(body)), len(body))
            else:
                self._write(data)

    def _body(self, message: HttpBody) -> None:
        more = message.more
        self.phase = EXCHANGE[self.phase][_BODY if more else _END]
        body = message.body
        if self.head.http_10:
            data = body
        elif body:
            data = chunk(body) if more else chunk(body) + LAST_CHUNK
        else:
            data = b"" if more else LAST_CHUNK
        if data:
            self._write(data, len(body))
        if not more:
            self._finish()

    def _cut(self) -> None:
        self.phase = EXCHANGE[self.phase][_CUT]
        self.keep_alive = False  # the close tells the client the body is incomplete
        self._finish()

    def _settle(self) -> None:
        self.phase = EXCHANGE[self.phase][_SETTLE]
        self.outbox.settled.append(self)

    def _dropped(self, message: Message) -> None:
        """A frame for a detached request: nobody reads it, but the stream must go on."""
        if isinstance(message, HttpStart | HttpBody):
            final = not message.more
            streamed = len(message.body) if message.more or isinstance(message, HttpBody) else 0
        else:
            final, streamed = True, 0
        self.phase = EXCHANGE[self.phase][_SETTLE if final else _FRAME]
        if streamed:
            self.outbox.acks.append((self, streamed))
        if final:
            self.outbox.settled.append(self)

    # -- the request's own stream: a streamed upload ---------------------------------------

    def upload(self, body: bytes, more: bool) -> None:
        """More of a streamed request body: to the replica as its window allows."""
        upstream = self.upstream
        phase = self.phase
        if upstream is None or phase is DONE or phase is ABANDONED or phase is DETACHED:
            return  # answered (or given up) already: the rest is read and dropped
        upstream.push(HttpBody(id=0, body=body, more=more), len(body))
        self.send_ready()

    def refused(self, status: int, body: bytes) -> None:
        """Its streamed body broke a limit (too large, stalled): answer `status` if nothing
        went out yet (else cut the response), and stop the request at its replica."""
        phase = self.phase
        if phase is QUEUED or phase is WAITING:
            self.respond(status, body)
        elif phase is STREAMING:
            self._cut()
        else:
            return
        if phase is not QUEUED:
            self.outbox.cancels.append(self)

    def credit(self, amount: int) -> None:
        """The replica granted room for `amount` more of the request's stream."""
        upstream = self.upstream
        if upstream is not None and self.phase is not DONE:
            upstream.credit(amount)
            self.send_ready()

    def send_ready(self) -> None:
        upstream = self.upstream
        assert upstream is not None
        sends = self.outbox.sends
        for frame in upstream.ready():
            sends.append((self, frame))
        self.line.upload_window(self, upstream.paused)

    # -- output ----------------------------------------------------------------------------

    def _write(self, data: bytes, body: int = 0) -> None:
        """`data` goes out now if this exchange is first in line, else waits its turn;
        `body` of its bytes are a streamed response's body (acknowledged once written)."""
        if self.line.exchanges[0] is self:
            self.outbox.out.append(data)
            if body:
                self.line.acknowledge(self, body)
        else:
            if self.buffer is None:
                self.buffer = [data]
            else:
                self.buffer.append(data)
            self.buffered += body

    def flush(self) -> None:
        """Its turn came: what it buffered goes out."""
        buffer = self.buffer
        if buffer is not None:
            self.buffer = None
            self.outbox.out.extend(buffer)
            if self.buffered:
                self.line.acknowledge(self, self.buffered)
                self.buffered = 0

    def _stop_upload(self) -> None:
        """Answered before its upload ended: the rest is read and dropped."""
        assert self.upstream is not None
        self.upstream.drop()
        self.line.upload_window(self, False)

    def _finish(self) -> None:
        if self.upstream is not None:
            self._stop_upload()
        self.outbox.records.append(self)
        if self.line.exchanges[0] is self:
            self.line.advance_line()
