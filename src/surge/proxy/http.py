"""The HTTP/1.1 server of a proxy: httptools parsing on uvloop, one Exchange per request.

Requests on one connection may be pipelined; responses leave in request order (an
Exchange that finishes early buffers until those before it are written). Each Exchange
is the router's sink for its request: it turns response frames into HTTP bytes, and
router failures into status codes (503 overload with Retry-After, 408 timeout, 500
replica died). A client that goes away cancels its requests through the router, unless
it sent `x-request-disconnect-disabled: ?1`.

HEAD and 1xx/204/304 responses carry no body; an HTTP/1.0 client gets a streamed body
unframed, ended by the close; `Expect: 100-continue` is answered when nothing is owed;
an Upgrade request is served as plain HTTP and then closed; CONNECT is refused.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httptools

from surge.errors import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaDiedError,
    RequestCancelledError,
)
from surge.policy.admission import retry_after_header
from surge.policy.auth import Refusal
from surge.proxy.responses import CONTINUE, chunk, forbids_body, head, openai_error, simple
from surge.router.replica_link import Pending
from surge.router.router import Router
from surge.transport.messages import Failure, HttpBody, HttpRequest, HttpStart, Message

if TYPE_CHECKING:
    from surge.proxy.server import Proxy

__all__ = ["HttpConnection"]

log = logging.getLogger("surge.proxy")

NO_ROUTE = ("", "", "")
# surge_rejected_requests_total{reason} for requests refused before they reach a router.
REFUSAL_REASONS = {400: "malformed", 408: "header_timeout", 413: "body_too_large",
                   431: "headers_too_large"}

_ids = itertools.count(1)
_ID_PREFIX = os.urandom(4).hex()


def new_request_id() -> bytes:
    return f"{_ID_PREFIX}-{next(_ids):x}".encode()


MAX_REQUEST_ID_BYTES = 200
_PRINTABLE = bytes(range(0x21, 0x7F))


def _usable_request_id(value: bytes) -> bool:
    """A client's x-request-id is kept when it is 1-200 visible ASCII characters."""
    return 0 < len(value) <= MAX_REQUEST_ID_BYTES and not value.translate(None, _PRINTABLE)


class Exchange:
    """One request/response on a connection; the router's sink for it."""

    __slots__ = ("conn", "detached", "done", "head_only", "held", "http_10", "keep_alive",
                 "labels", "method", "no_body", "out", "owed", "path", "pending", "request_id",
                 "router", "started", "status", "streaming", "timer")

    def __init__(self, conn: HttpConnection, request_id: bytes, keep_alive: bool, *,
                 head_only: bool = False, http_10: bool = False) -> None:
        self.conn = conn
        self.request_id = request_id
        self.keep_alive = keep_alive
        self.head_only = head_only  # a HEAD request: headers as for GET, never a body
        self.http_10 = http_10  # an HTTP/1.0 client: no chunked encoding
        self.no_body = head_only
        self.detached = False  # x-request-disconnect-disabled: run on if the client goes
        self.out: list[bytes] = []
        # Flow control of a streamed body (transport/flow.py): payload bytes written to the
        # client's socket and not yet reported consumed (held while the socket is paused),
        # and those still waiting in `out` behind earlier responses.
        self.owed = 0
        self.held = 0
        self.done = False
        self.streaming = False
        self.pending: Pending | None = None
        self.router: Router | None = None
        self.timer: asyncio.TimerHandle | None = None
        # For metrics and the access log: (application, deployment, route), method, when
        # the request began (loop time) and the status it got.
        self.labels: tuple[str, str, str] = NO_ROUTE
        self.method = ""
        self.path = ""
        self.started = conn.proxy.now()  # the loop's clock has only millisecond resolution
        self.status = 0

    # -- Sink ----------------------------------------------------------------------------

    def deliver(self, message: Message) -> None:
        if self.done:
            return
        if isinstance(message, HttpStart):
            self.status = message.status
            no_body = self.no_body = self.head_only or forbids_body(message.status)
            if message.more:
                self.streaming = True
                if self.http_10 and not no_body:
                    self.keep_alive = False  # HTTP/1.0 has no chunks: the close ends the body
                data = head(message.status, message.headers, self.request_id, None,
                            self.keep_alive, chunked=not self.http_10, http_10=self.http_10)
                if no_body:
                    # HEAD (or 204/304): the head is the whole answer. Stop the stream
                    # rather than wait for it: it may never end (server-sent events).
                    self.write(data)
                    if self.pending is not None and self.router is not None:
                        self.router.cancel(self.pending)
                    self.finish()
                    return
                if message.body:
                    data += self._frame(message.body)
                self.write(data)
                self._passed_on(len(message.body))
            else:
                data = head(message.status, message.headers, self.request_id,
                            len(message.body), self.keep_alive, http_10=self.http_10)
                self.write(data if no_body else data + message.body)
                self.finish()
        elif isinstance(message, HttpBody):
            if message.body and not self.no_body:
                self.write(self._frame(message.body))
            if message.more:
                self._passed_on(len(message.body))
            else:
                if not self.no_body and not self.http_10:
                    self.write(b"0\r\n\r\n")
                self.finish()
        elif isinstance(message, Failure):
            if self.streaming:  # the head is out; all we can do is cut the stream
                self.keep_alive = False
                self.finish()
            elif message.kind == "cancelled":
                self.error(499, "Request cancelled.")
            else:
                self.error(500, "Internal Server Error")

    def fail(self, exc: BaseException) -> None:
        if self.done:
            return
        if self.streaming:
            self.keep_alive = False
            self.finish()
        elif isinstance(exc, BackPressureError):  # 503, or 429 by backpressure_config
            self.error(exc.status_code, str(exc),
                       [(b"retry-after", retry_after_header(exc.retry_after_s).encode())])
        elif isinstance(exc, DeploymentUnavailableError):
            self.conn.proxy.recorder.rejected(self.labels[0], self.labels[1], "unavailable")
            self.error(503, str(exc), [(b"retry-after", b"1")])
        elif isinstance(exc, ReplicaDiedError):
            self.error(500, f"{exc}; the request may or may not have run.")
        elif isinstance(exc, RequestCancelledError):
            self.error(499, "Request cancelled.")
        else:
            log.error("request %s failed: %r", self.request_id.decode(), exc)
            self.error(500, "Internal Server Error")

    # -- output --------------------------------------------------------------------------

    def respond(self, status: int, body: bytes,
                extra: list[tuple[bytes, bytes]] | None = None,
                content_type: bytes = b"text/plain; charset=utf-8") -> None:
        self.status = status
        self.write(simple(status, body, self.request_id, self.keep_alive, content_type, extra,
                          http_10=self.http_10, head_only=self.head_only))
        self.finish()

    def error(self, status: int, message: str,
              extra: list[tuple[bytes, bytes]] | None = None) -> None:
        """The proxy's own error answer: plain text, as Ray Serve's proxy, except on an
        OpenAI API path (`/v1/...` under the route's prefix), where OpenAI's clients
        expect OpenAI's JSON error body."""
        prefix = self.labels[2].rstrip("/")
        if self.path.startswith(prefix + "/v1/"):
            self.respond(status, openai_error(status, message), extra, b"application/json")
        else:
            self.respond(status, message.encode(), extra)

    def _passed_on(self, nbytes: int) -> None:
        """A stream frame's body went to the client (or waits in `out` behind others)."""
        conn = self.conn
        if conn.exchanges and conn.exchanges[0] is self:
            self.owed += nbytes
            self.report_consumed()
        else:
            self.held += nbytes

    def report_consumed(self) -> None:
        """Tell the replica the client took what was written, unless its socket is full."""
        if self.owed and not self.conn.write_paused and self.pending is not None:
            owed, self.owed = self.owed, 0
            self.pending.consumed(owed)

    def _frame(self, data: bytes) -> bytes:
        return data if self.http_10 else chunk(data)

    def write(self, data: bytes) -> None:
        conn = self.conn
        if conn.exchanges and conn.exchanges[0] is self:
            if conn.transport is not None:
                conn.transport.write(data)
        else:
            self.out.append(data)

    def finish(self) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.conn.proxy.record(self)
        self.conn.exchange_finished()

    def on_timeout(self, timeout_s: float) -> None:
        self.timer = None
        if self.done:
            if self.detached and self.pending is not None and self.router is not None:
                self.router.cancel(self.pending)  # its client is gone; its deadline holds
            return
        if self.pending is not None and self.router is not None:
            self.router.cancel(self.pending)
        if self.streaming:
            self.keep_alive = False
            self.finish()
        else:
            self.error(408, f"Request timed out after {timeout_s:g}s.")

    def abandon(self) -> None:
        """The client went away: cancel the request wherever it is (logged as 499)."""
        if self.done:
            return
        self.done = True
        self.status = 499  # logged and counted as 499, as Ray Serve does
        self.conn.proxy.record(self)
        if self.detached and self.pending is not None:
            return  # it runs on (x-request-disconnect-disabled); the timer still bounds it
        if self.timer is not None:
            self.timer.cancel()
        if self.pending is not None and self.router is not None:
            self.router.cancel(self.pending)


class HttpConnection(asyncio.Protocol):
    __slots__ = ("body", "body_at", "body_size", "client", "denial", "exchanges", "header_bytes",
                 "headers", "headers_done", "idle_since", "parser", "proxy", "receiving",
                 "refused", "started_at", "transport", "upgraded", "url", "write_paused")

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.exchanges: deque[Exchange] = deque()
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.body_size = 0
        self.client = ""
        self.idle_since: float | None = None  # monotonic time the connection went idle
        self.refused = False
        self.header_bytes = 0
        self.headers_done = False
        self.started_at = 0.0  # monotonic time the current request began
        self.receiving = False  # between the first byte of a request and its end
        self.upgraded = False  # the last request asked for an Upgrade we serve as plain HTTP
        self.denial: Refusal | None = None  # the request lacks its application's token
        self.body_at = 0.0  # monotonic time the body last made progress (or the headers ended)
        self.write_paused = False  # the client's socket buffer is above its high-water mark

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        if len(self.proxy.connections) >= self.proxy.spec.max_connections:
            self.proxy.recorder.rejected("", "", "connection_limit")
            refusal = simple(503, b"Too many connections; retry later.", new_request_id(),
                             keep_alive=False, extra=[(b"retry-after", b"1")])
            transport.write(refusal)  # type: ignore[attr-defined]
            transport.close()
            self.refused = True
            return
        self.proxy.connections.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self.upgraded:
                # Served as plain HTTP (RFC 9110 7.8 lets a server ignore Upgrade); that
                # exchange closes the connection, and whatever follows is not HTTP.
                self.refused = True
            else:  # CONNECT
                self._refuse(400, b"Protocol upgrades are not supported.")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"Malformed HTTP request: {exc}".encode())

    def pause_writing(self) -> None:
        self.write_paused = True  # streams stop reporting consumption: replicas stop

    def resume_writing(self) -> None:
        self.write_paused = False
        for exchange in self.exchanges:
            exchange.report_consumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.connections.discard(self)
        self.idle_since = None
        for exchange in self.exchanges:
            exchange.abandon()
        self.exchanges.clear()
        self.transport = None

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = []
        self.body_size = 0
        self.receiving = True
        self.idle_since = None
        self.header_bytes = 0
        self.headers_done = False
        self.started_at = self.proxy.now()
        self.denial = None

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self._count_header_bytes(len(name) + len(value) + 4)

    def _count_header_bytes(self, size: int) -> None:
        self.header_bytes += size
        limit = self.proxy.spec.max_header_bytes
        if self.header_bytes > limit:
            self._refuse(431, f"Request line and headers exceed {limit} bytes.".encode())
            raise httptools.HttpParserCallbackError("headers too large")

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.body_at = self.proxy.now()
        # Authentication comes before the body is buffered: a refused body is read and
        # dropped (within max_body_bytes), so the connection stays usable.
        self.denial = self.proxy.authenticate(self.url, self.headers)
        limit = self.proxy.spec.max_body_bytes
        expects_body = expects_continue = False
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit():
                if int(value) > limit:
                    self._refuse(413,
                                 f"Request body exceeds the limit of {limit} bytes.".encode())
                    raise httptools.HttpParserCallbackError("body too large")
                expects_body = expects_body or int(value) > 0
            elif name == b"transfer-encoding":
                expects_body = True
            elif name == b"expect" and value.lower() == b"100-continue":
                expects_continue = True
        # A client that asked to hear "100 Continue" before sending its body (curl does
        # for bodies over 1 KiB) would otherwise wait a second for it. An interim
        # response may only go out when no earlier response is still owed.
        if (expects_continue and expects_body and not self.exchanges and self.denial is None
                and self.parser.get_http_version() == "1.1"
                and self.transport is not None and not self.transport.is_closing()):
            self.transport.write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        self.body_at = self.proxy.now()
        if self.body_size > self.proxy.spec.max_body_bytes:
            limit = self.proxy.spec.max_body_bytes
            self._refuse(413, f"Request body exceeds the limit of {limit} bytes.".encode())
            raise httptools.HttpParserCallbackError("body too large")
        if self.denial is None:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.receiving = False
        if self.transport is None or self.transport.is_closing():
            return
        parser = self.parser
        keep_alive = bool(parser.should_keep_alive())
        if parser.should_upgrade():
            if parser.get_method() == b"CONNECT":
                return  # data_received answers 400 when the parser stops on it
            self.upgraded = True
            keep_alive = False
        exchange = Exchange(self, self._request_id(), keep_alive,
                            head_only=parser.get_method() == b"HEAD",
                            http_10=parser.get_http_version() == "1.0")
        for name, value in self.headers:
            if name == b"x-request-disconnect-disabled":
                exchange.detached = value.strip().lower() in (b"?1", b"1", b"true")
        self.exchanges.append(exchange)
        if self.denial is not None:
            exchange.respond(self.denial.status, self.denial.message,
                             [(b"www-authenticate", self.denial.challenge)])
            return
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        try:
            self.proxy.dispatch(exchange, parser.get_method().decode(), self.url, self.headers,
                                body, parser.get_http_version())
        except httptools.HttpParserInvalidURLError:
            exchange.respond(400, b"Malformed request target.")
        except Exception as exc:
            # Never leave the exchange unanswered: every later response waits behind it.
            if exchange.pending is not None and exchange.router is not None:
                exchange.router.cancel(exchange.pending)
            exchange.fail(exc)

    # -- helpers -------------------------------------------------------------------------

    def exchange_finished(self) -> None:
        exchanges = self.exchanges
        transport = self.transport
        while exchanges and exchanges[0].done:
            finished = exchanges.popleft()
            if not finished.keep_alive:
                if transport is not None:
                    transport.close()
                for following in exchanges:  # nothing after a close can be answered
                    following.abandon()
                exchanges.clear()
                return
            if exchanges and transport is not None:
                following = exchanges[0]
                if following.out:
                    transport.write(b"".join(following.out))
                    following.out.clear()
                    following.owed += following.held
                    following.held = 0
                    following.report_consumed()
        if not exchanges and not self.receiving:
            self._arm_idle_timer()

    def _arm_idle_timer(self) -> None:
        # No timer per request: the proxy's sweeper closes connections idle too long.
        self.idle_since = self.proxy.now()

    def check_slow_headers(self, now: float, timeout: float) -> None:
        """Answer 408 to a client that has taken too long to send its headers (slowloris)."""
        if self.receiving and not self.headers_done and now - self.started_at >= timeout:
            self._refuse(408, f"Request headers not received within {timeout:g}s.".encode())

    def check_slow_body(self, now: float, timeout: float) -> None:
        """Answer 408 when a body stops arriving (truncated, or sent to hold the slot)."""
        if self.receiving and self.headers_done and now - self.body_at >= timeout:
            self._refuse(408, f"Request body stalled for {timeout:g}s.".encode(),
                         "body_timeout")

    def close_if_idle(self, now: float, timeout: float) -> None:
        since = self.idle_since
        if (since is not None and now - since >= timeout and not self.exchanges
                and not self.receiving and self.transport is not None):
            self.transport.close()

    def _request_id(self) -> bytes:
        """The client's x-request-id for the request being read, else a new one."""
        for name, value in self.headers:
            # Echoed in a header and written to logs: printable ASCII only, bounded
            # (a non-UTF-8 id once left its request unanswered), else one of ours.
            if name == b"x-request-id" and _usable_request_id(value):
                return value
        return new_request_id()

    def _refuse(self, status: int, body: bytes, reason: str = "") -> None:
        """Answer an unreadable request and close: the stream cannot be trusted after it."""
        if self.refused or self.transport is None or self.transport.is_closing():
            return
        self.refused = True
        self.proxy.recorder.rejected("", "", reason or REFUSAL_REASONS.get(status, str(status)))
        exchange = Exchange(self, self._request_id(), keep_alive=False)
        self.exchanges.append(exchange)
        exchange.respond(status, body)


def decode_path(url: bytes) -> tuple[str, bytes, bytes]:
    """(percent-decoded path, query string, raw path bytes as sent)."""
    parsed = httptools.parse_url(url)
    raw = parsed.path or b"/"
    path = raw.decode("latin-1")
    if "%" in path:
        path = unquote(path)
    return path, parsed.query or b"", raw


def make_request(method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
                 body: bytes, client: str, route_prefix: str, request_id: bytes,
                 http_version: str, root_path: str, raw_path: bytes,
                 scheme: str = "http") -> HttpRequest:
    return HttpRequest(id=0, method=method, path=path, query=query, headers=headers, body=body,
                       client=client, route_prefix=route_prefix,
                       request_id=request_id.decode(), http_version=http_version,
                       root_path=root_path, raw_path=raw_path, scheme=scheme)
