"""One parsed request head per request, built once when its headers are in.

Everything the proxy decides from a request line and its headers is decided in
`read_head`, and each header is read once, as the parser hands it over
(`HeadFields.note`): the decoded path and its compiled route, the bearer-token check
(policy/auth.py), the request id (the client's x-request-id when usable, else a new
one), the deadline (x-request-timeout-seconds), whether the request runs on without its
client (x-request-disconnect-disabled), whether the client waits for "100 Continue", the
multiplexed model it asks for (serve_multiplexed_model_id, which the router routes by).
A request the proxy answers itself (a built-in path, no route, a refusal) carries that
`Answer`; one without an answer goes to its route's router.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, NamedTuple, Protocol
from urllib.parse import unquote

import httptools

from surge.policy.auth import Refusal, check_bearer
from surge.proxy.routes import CompiledRoutes, Route

__all__ = ["NO_ROUTE", "TEXT", "Answer", "HeadFields", "RequestHead", "Routing",
           "new_request_id", "read_head", "split_target", "usable_request_id"]

NO_ROUTE = ("", "", "")  # metric labels of a request that reached no application
TEXT = b"text/plain; charset=utf-8"
MAX_REQUEST_ID_BYTES = 200
_PRINTABLE = bytes(range(0x21, 0x7F))
_ids = itertools.count(1)
_ID_PREFIX = os.urandom(4).hex().encode()
_METHODS = {m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH",
                                    "OPTIONS", "CONNECT", "TRACE")}
_ON = (b"?1", b"1", b"true")  # x-request-disconnect-disabled values that mean yes


def new_request_id() -> bytes:
    return b"%s-%x" % (_ID_PREFIX, next(_ids))


def usable_request_id(value: bytes) -> bool:
    """A client's x-request-id is kept when it is 1-200 visible ASCII characters.

    It is echoed in a header and written to logs: a non-UTF-8 id once left its request
    unanswered, so anything else is replaced by one of ours."""
    return 0 < len(value) <= MAX_REQUEST_ID_BYTES and not value.translate(None, _PRINTABLE)


class Answer(NamedTuple):
    """A response the proxy gives itself, decided from the head alone."""

    status: int
    body: bytes
    extra: tuple[tuple[bytes, bytes], ...] = ()
    content_type: bytes = TEXT
    reason: str = ""  # surge_rejected_requests_total{reason}; "" when not counted there
    invites_body: bool = True  # False: no "100 Continue" for it (a body it will refuse)


BAD_TARGET = Answer(400, b"Malformed request target.")


def refusal_answer(refusal: Refusal) -> Answer:
    return Answer(refusal.status, refusal.message, ((b"www-authenticate", refusal.challenge),),
                  invites_body=False)


class HeadFields:
    """The headers the proxy acts on, noted as they arrive (one instance per connection)."""

    __slots__ = ("authorization", "declared", "detached", "expect_continue", "model_id",
                 "noted", "request_id", "timeout")

    # Lower-case names `note` wants; every other header only travels to the replica.
    WANTED = frozenset({b"content-length", b"transfer-encoding", b"expect", b"x-request-id",
                        b"x-request-timeout-seconds", b"x-request-disconnect-disabled",
                        b"authorization", b"serve_multiplexed_model_id"})

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.noted = False  # nothing to reset before the next request
        self.request_id: bytes | None = None  # the first usable x-request-id
        self.timeout: bytes | None = None  # the first x-request-timeout-seconds
        self.detached = False  # the last x-request-disconnect-disabled
        self.expect_continue = False
        self.declared = -1  # the largest Content-Length; 0 with Transfer-Encoding; -1: none
        self.authorization: list[bytes] | None = None
        self.model_id = ""  # serve_multiplexed_model_id: the router routes by it

    def note(self, name: bytes, value: bytes) -> None:
        self.noted = True
        if name == b"content-length":
            if value.isdigit():
                self.declared = max(self.declared, int(value))
        elif name == b"transfer-encoding":
            self.declared = max(self.declared, 1)  # a body of unknown length follows
        elif name == b"expect":
            self.expect_continue = self.expect_continue or value.lower() == b"100-continue"
        elif name == b"x-request-id":
            if self.request_id is None and usable_request_id(value):
                self.request_id = value
        elif name == b"x-request-timeout-seconds":
            if self.timeout is None:
                self.timeout = value
        elif name == b"x-request-disconnect-disabled":
            self.detached = value.strip().lower() in _ON
        elif name == b"serve_multiplexed_model_id":
            self.model_id = value.decode("latin-1")
        elif self.authorization is None:
            self.authorization = [value]
        else:
            self.authorization.append(value)


def parse_timeout(value: bytes | None, default: float | None) -> float | None:
    """x-request-timeout-seconds: seconds (>= 0); inf: none; unreadable: the default."""
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        return default
    if math.isnan(seconds):
        return default
    return None if math.isinf(seconds) else max(0.0, seconds)


def split_target(url: bytes) -> tuple[str, bytes, bytes]:
    """(percent-decoded path, query string, raw path bytes as sent); raises
    httptools.HttpParserInvalidURLError for a target that is not a URL."""
    parsed = httptools.parse_url(url)
    raw: bytes = parsed.path or b"/"
    path = raw.decode("latin-1")
    if "%" in path:
        path = unquote(path)
    return path, parsed.query or b"", raw


class RequestHead:
    """A request line and headers, read: what the proxy needs to answer or forward it."""

    __slots__ = ("answer", "detached", "expect_continue", "head_only", "headers", "http_10",
                 "http_version", "labels", "method", "model_id", "path", "query", "raw_path",
                 "request_id", "route", "timeout")

    def __init__(self, method: str, path: str, query: bytes, raw_path: bytes,
                 headers: list[tuple[bytes, bytes]], http_version: str, request_id: bytes,
                 route: Route[Any] | None, labels: tuple[str, str, str], answer: Answer | None,
                 timeout: float | None, detached: bool, expect_continue: bool,
                 model_id: str = "") -> None:
        self.method = method
        self.path = path
        self.query = query
        self.raw_path = raw_path
        self.headers = headers  # lower-case names, as the replica gets them
        self.http_version = http_version
        self.http_10 = http_version == "1.0"  # no chunked encoding: a stream ends at the close
        self.head_only = method == "HEAD"  # headers as for GET, never a body
        self.request_id = request_id  # printable ASCII (usable_request_id or ours)
        self.route = route  # where it goes when `answer` is None
        self.labels = labels  # (application, deployment, route) for metrics and logs
        self.answer = answer  # the proxy's own response, or None: forward it
        self.timeout = timeout  # seconds from dispatch until 408; None: none
        self.detached = detached  # runs on if its client goes away
        self.expect_continue = expect_continue
        self.model_id = model_id  # serve_multiplexed_model_id, "" when none

    @classmethod
    def bare(cls, request_id: bytes, method: str = "") -> RequestHead:
        """The head of a request refused before its headers could be read."""
        return cls(method, "", b"", b"", [], "1.1", request_id, None, NO_ROUTE, None, None,
                   False, False)

    def __repr__(self) -> str:
        where = self.answer.status if self.answer is not None else self.route
        return (f"<RequestHead {self.method} {self.path!r} HTTP/{self.http_version} "
                f"id={self.request_id.decode()} -> {where}>")


class Routing(Protocol):
    """What reading a head asks of the proxy's site (proxy/site.py's `Site`)."""

    @property
    def default_timeout(self) -> float | None: ...

    def routes(self) -> CompiledRoutes[Any]: ...

    def builtin(self, path: str) -> tuple[Answer, tuple[str, str, str]]: ...

    def not_found(self, path: str) -> Answer: ...


def read_head(method: bytes, url: bytes, http_version: str,
              headers: list[tuple[bytes, bytes]], fields: HeadFields,
              site: Routing) -> RequestHead:
    """Decide once, from the request line and the noted headers, what becomes of it."""
    name = _METHODS.get(method) or method.decode("latin-1")
    request_id = fields.request_id or b"%s-%x" % (_ID_PREFIX, next(_ids))
    timeout = (site.default_timeout if fields.timeout is None
               else parse_timeout(fields.timeout, site.default_timeout))
    route: Route[Any] | None = None
    labels = NO_ROUTE
    try:
        path, query, raw = split_target(url)
    except httptools.HttpParserInvalidURLError:
        path, query, raw = "", b"", url
        answer: Answer | None = BAD_TARGET
    else:
        if path.startswith("/-/"):
            answer, labels = site.builtin(path)
        else:
            route = site.routes().match(path)
            if route is None:
                answer = site.not_found(path)
            else:
                labels = route.labels
                answer = None
                if route.digests is not None:
                    refusal = check_bearer(fields.authorization or [], route.digests)
                    if refusal is not None:
                        answer = refusal_answer(refusal)
    return RequestHead(name, path, query, raw, headers, http_version, request_id, route, labels,
                       answer, timeout, fields.detached, fields.expect_continue, fields.model_id)
