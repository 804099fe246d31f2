"""The shell's part, played for tests: drive a sans-IO H1Connection with bytes and frames.

`Wire` does what proxy/http.py does with the core's decisions, minus sockets and
routers: bytes written pile up in `written`, dispatched exchanges wait in `waiting` for
the test to answer them, and reading pauses when the core asks (input sent meanwhile is
held back, as a paused transport would). `parse` reads the written bytes back as
responses, the way a client would.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from surge.model import AccessTokens, ProxySpec, RouteTable, RouteTarget
from surge.policy.auth import token_digest
from surge.proxy.exchange import Exchange
from surge.proxy.h1 import H1Connection
from surge.proxy.h1_state import Conn
from surge.proxy.site import Site
from surge.testing import FakeClock
from surge.transport.messages import HttpBody, HttpStart, Message

TOKEN = "a-token-of-sixteen-or-more"
JSON = [(b"content-type", b"application/json")]


class FakeRouter:
    """What a compiled route sends to; the core never calls it (the shell would)."""

    def __init__(self, target: RouteTarget) -> None:
        self.name = f"{target.app}#{target.deployment}"

    def __repr__(self) -> str:
        return f"<FakeRouter {self.name}>"


@dataclass
class Source:
    routes: RouteTable


def table(*prefixes: str, locked: tuple[str, ...] = ()) -> RouteTable:
    auth = AccessTokens((token_digest(TOKEN),), "test")
    return RouteTable(tuple(RouteTarget(f"app{p}", "Ingress", p, auth if p in locked else None)
                            for p in prefixes))


def make_site(*prefixes: str, clock: FakeClock | None = None, locked: tuple[str, ...] = (),
              **limits: object) -> Site:
    spec = ProxySpec(**{"host": "127.0.0.1", "port": 8000, "request_timeout_s": None,  # type: ignore[arg-type]
                        "keep_alive_timeout_s": 5.0, "max_body_bytes": 1000,
                        "max_header_bytes": 2048, "request_header_timeout_s": 2.0,
                        "request_body_timeout_s": 3.0, **limits})
    clock = clock or FakeClock()
    return Site(spec, clock.monotonic, Source(table(*(prefixes or ("/app",)), locked=locked)),
                FakeRouter)


class Wire:
    def __init__(self, site: Site | None = None) -> None:
        self.site = site or make_site()
        self.core = H1Connection(self.site, self.collect)
        self.written = bytearray()
        self.after_close = bytearray()  # anything written once closed (must stay empty)
        self.waiting: list[Exchange] = []  # dispatched; the test answers them
        self.cancelled: list[Exchange] = []
        self.acks: list[tuple[Exchange, int]] = []
        self.records: list[Exchange] = []
        self.settled: list[Exchange] = []
        self.sends: list[tuple[Exchange, Message]] = []  # frames for the replica
        self.rejections: list[tuple[str, str, str]] = []
        self.closed = False
        self.reset = False  # closed with a TCP reset, as the core asked
        self.paused = False  # reading, as the transport was last told
        self.held: list[bytes] = []  # input that arrived while reading was paused

    def __repr__(self) -> str:
        return f"<Wire {self.core!r} waiting={len(self.waiting)} closed={self.closed}>"

    def send(self, data: bytes) -> None:
        self.held.append(data)
        self.collect()

    def collect(self) -> None:
        core = self.core
        self.waiting += core.dispatch
        core.dispatch.clear()
        for exchange in core.cancels:
            self.cancelled.append(exchange)
            if exchange in self.waiting:  # as a router does: no frames once cancelled
                self.waiting.remove(exchange)
        core.cancels.clear()
        if core.out:
            (self.after_close if self.closed else self.written).extend(b"".join(core.out))
            core.out.clear()
        self.acks += core.acks
        core.acks.clear()
        self.sends += core.sends
        core.sends.clear()
        self.records += core.records
        core.records.clear()
        self.settled += core.settled
        core.settled.clear()
        self.rejections += core.rejections
        core.rejections.clear()
        if core.state is Conn.CLOSED and not self.closed:
            self.closed = True
            self.reset = core.reset
        self.paused = core.reading_paused or core.upload_paused
        while self.held and not self.paused and not self.closed:
            core.receive_data(self.held.pop(0))
            self.collect()

    def reply(self, exchange: Exchange, body: bytes = b"ok", status: int = 200,
              headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.waiting.remove(exchange)
        headers = [(b"content-type", b"text/plain"),
                   (b"content-length", str(len(body)).encode())] if headers is None else headers
        self.frame(exchange, HttpStart(id=1, status=status, headers=headers, body=body,
                                       more=False))

    def stream(self, exchange: Exchange, *chunks: bytes, end: bool = True) -> None:
        """A streamed answer: the first chunk with the head, the rest as body frames."""
        self.waiting.remove(exchange)
        first, *rest = chunks or (b"",)
        self.frame(exchange, HttpStart(id=1, status=200, headers=[(b"content-type", b"text/plain")],
                                       body=first, more=bool(rest) or not end))
        for index, piece in enumerate(rest):
            if exchange in self.cancelled:
                return  # as a router does: a cancelled request gets no more frames
            self.frame(exchange, HttpBody(id=1, body=piece, more=index < len(rest) - 1 or not end))

    def frame(self, exchange: Exchange, message: Message) -> None:
        """As Exchange.deliver, but a frame the tables refuse raises here (deliver logs it)."""
        exchange.on_frame(message)
        self.collect()

    def acked(self, exchange: Exchange) -> int:
        return sum(n for e, n in self.acks if e is exchange)

    def responses(self, head: tuple[int, ...] = ()) -> list[Response]:
        return parse(bytes(self.written), head)


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = True  # False: cut off (a chunked body without its last chunk)

    @property
    def request_id(self) -> str:
        return self.headers["x-request-id"]


def parse(data: bytes, head: Collection[int | str] = ()) -> list[Response]:
    """Every response in `data`, in order; `head`: the indexes, or x-request-ids, of the
    responses to HEAD requests (they have no body).

    Interim responses (100 Continue) are listed too. A body without framing runs to the
    end of the data (HTTP/1.0: the close ends it)."""
    responses: list[Response] = []
    position, final = 0, 0
    while position < len(data):
        end = data.index(b"\r\n\r\n", position)
        status_line, *lines = data[position:end].decode("latin-1").split("\r\n")
        assert status_line.startswith("HTTP/1.1 "), status_line
        response = Response(int(status_line.split()[1]))
        for line in lines:
            name, _, value = line.partition(":")
            response.headers[name.strip().lower()] = value.strip()
        position = end + 4
        responses.append(response)
        if response.status < 200:
            continue
        if (final in head or response.headers.get("x-request-id") in head
                or response.status in (204, 304)):
            pass
        elif "content-length" in response.headers:
            size = int(response.headers["content-length"])
            response.body = data[position:position + size]
            position += size
        elif response.headers.get("transfer-encoding") == "chunked":
            response.complete = False
            while position < len(data):
                line_end = data.index(b"\r\n", position)
                size = int(data[position:line_end], 16)
                position = line_end + 2
                if size == 0:
                    position += 2
                    response.complete = True
                    break
                response.body += data[position:position + size]
                position += size + 2
        else:
            response.body, position = data[position:], len(data)
        final += 1
    return responses


def request(method: str = "GET", path: str = "/app", *headers: tuple[str, str],
            body: bytes = b"", version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: x", *(f"{n}: {v}" for n, v in headers)]
    if body and not any(n.lower() in ("content-length", "transfer-encoding") for n, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
