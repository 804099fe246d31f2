"""A raw HTTP/2 client for the conformance table (tests/proxy/h2_conformance.py), and a
real surge gRPC port to point it at.

`Client` writes frames byte by byte as a test composes them (nothing checks them on the
way out: the point is to send what a conformant client never would) and reads the
server's frames back; its `expect_*` methods are the checks h2spec makes of an answer,
each a little stricter (a connection error must come as a GOAWAY with its code before
the close, not as a bare close). Header blocks are encoded by python-hyper's `hpack` and error
codes named by its `h2`, implementations independent of surge's.

`serving()` starts the gRPC ingress surge ships (proxy/grpc.py: GrpcIngress,
GrpcConnection round GrpcCore, codecs/h2.py) on a loopback port in a thread of its own,
on a `Proxy` whose one application is never called: its calls are the ones the port
answers itself (Ray's RayServeAPIService/Healthz, health, reflection), so no replica is
needed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import hpack
from h2.errors import ErrorCodes

from surge.model import ProxySpec, RouteTable, RouteTarget
from surge.proxy.grpc_status import HEALTHZ
from tests.raw_socket import RawSocket

__all__ = ["Client", "Failed", "Frame", "serving"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
KINDS = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING",
         "GOAWAY", "WINDOW_UPDATE", "CONTINUATION")
WAIT_S = 2.0  # how long an answer may take (h2spec's default timeout)

# A gRPC call the port serves itself: Ray's Healthz, an empty message.
CALL = [(":method", "POST"), (":scheme", "http"), (":path", HEALTHZ),
        (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]
MESSAGE = b"\x00\x00\x00\x00\x00"


class Failed(AssertionError):
    """The server's answer is not the one the rule requires."""


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    def __str__(self) -> str:
        kind = KINDS[self.kind] if self.kind < len(KINDS) else f"type {self.kind}"
        detail = ""
        if self.kind == RST_STREAM:
            detail = f" {self.code_name}"
        elif self.kind == GOAWAY:
            detail = f" {self.code_name} {self.payload[8:]!r}"
        return f"{kind} (flags 0x{self.flags:02x}, stream {self.stream}{detail})"

    @property
    def code(self) -> int:
        at = 4 if self.kind == GOAWAY else 0
        return int.from_bytes(self.payload[at:at + 4], "big")

    @property
    def code_name(self) -> str:
        return code_name(self.code)


CLOSED = "the connection closed"
TIMEOUT = "nothing within the timeout"


def code_name(code: int) -> str:
    """An error code's name in h2's table (RFC 9113 §7), or the number if it has none."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return str(code)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")
            + payload)


def setting(key: int, value: int) -> bytes:
    return key.to_bytes(2, "big") + value.to_bytes(4, "big")


class Client(RawSocket):
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        super().__init__(port, WAIT_S, host)
        self.encoder = hpack.Encoder()
        self._buffer = b""
        self.server_settings: dict[int, int] = {}
        self.closed = False

    # -- sending ---------------------------------------------------------------------------

    def send(self, raw: bytes) -> None:
        try:
            self.sock.sendall(raw)
        except OSError:  # the server closed first: what it said is still there to read
            self.closed = True

    def frame(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.send(frame(kind, flags, stream, payload))

    def block(self, headers: list[tuple[str, str]] | None = None) -> bytes:
        return bytes(self.encoder.encode(CALL if headers is None else headers))

    def headers(self, stream: int, headers: list[tuple[str, str]] | None = None,
                end_stream: bool = False, flags: int = END_HEADERS,
                block: bytes | None = None, before: bytes = b"", after: bytes = b"") -> None:
        """HEADERS carrying `block`, or else `headers` encoded (CALL's by default) between
        the raw octets `before` (a pad length, a priority, a table size update) and `after`
        (one more field, the padding)."""
        self.frame(HEADERS, flags | (END_STREAM if end_stream else 0), stream,
                   before + self.block(headers) + after if block is None else block)

    def continuation(self, stream: int, headers: list[tuple[str, str]] | None = None,
                     flags: int = END_HEADERS) -> None:
        """CONTINUATION carrying `headers` encoded (CALL's by default)."""
        self.frame(CONTINUATION, flags, stream, self.block(headers))

    def data(self, stream: int, payload: bytes = MESSAGE, end_stream: bool = True) -> None:
        self.frame(DATA, END_STREAM if end_stream else 0, stream, payload)

    def call(self, stream: int, headers: list[tuple[str, str]] | None = None) -> None:
        """A whole unary call: its headers, then its message ending the stream."""
        self.headers(stream, headers)
        self.data(stream)

    def settings(self, *pairs: tuple[int, int]) -> None:
        self.frame(SETTINGS, 0, 0, b"".join(setting(k, v) for k, v in pairs))

    def ping(self, payload: bytes = b"h2-conf!", flags: int = 0) -> None:
        self.frame(PING, flags, 0, payload)

    def rst(self, stream: int, code: int = ErrorCodes.CANCEL) -> None:
        self.frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))

    def window_update(self, stream: int, increment: int) -> None:
        self.frame(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))

    def priority(self, stream: int, depends_on: int = 0, weight: int = 255,
                 exclusive: bool = False) -> None:
        self.frame(PRIORITY, 0, stream, priority_field(depends_on, weight, exclusive))

    def handshake(self) -> None:
        """The preface and an empty SETTINGS; done once the server's SETTINGS came and it
        acknowledged this side's."""
        self.send(PREFACE + frame(SETTINGS, 0, 0))
        got_settings = got_ack = False
        while not (got_settings and got_ack):
            answer = self.read()
            if not isinstance(answer, Frame):
                raise Failed(f"handshake: {answer}")
            if answer.kind == SETTINGS and answer.flags & ACK:
                got_ack = True
            elif answer.kind == SETTINGS:
                for at in range(0, len(answer.payload), 6):
                    key = int.from_bytes(answer.payload[at:at + 2], "big")
                    self.server_settings[key] = int.from_bytes(answer.payload[at + 2:at + 6],
                                                               "big")
                self.frame(SETTINGS, ACK, 0)
                got_settings = True

    # -- reading ---------------------------------------------------------------------------

    def read(self) -> Frame | str:
        """The server's next frame, or CLOSED, or TIMEOUT."""
        while True:
            if len(self._buffer) >= 9:
                length = int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) >= 9 + length:
                    head, self._buffer = self._buffer[:9 + length], self._buffer[9 + length:]
                    return Frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF,
                                 head[9:])
            if self.closed:
                return CLOSED
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return TIMEOUT
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return CLOSED
            self._buffer += chunk

    def wait_for(self, kind: int) -> Frame:
        """The next frame of `kind` (others are skipped, as h2spec's WaitEventByType)."""
        while True:
            answer = self.read()
            if not isinstance(answer, Frame):
                raise Failed(f"expected a {KINDS[kind]} frame, got {answer}")
            if answer.kind == kind:
                return answer

    # -- the checks ------------------------------------------------------------------------

    def expect_connection_error(self, *codes: int) -> None:
        """GOAWAY with one of `codes`, then the close."""
        while True:
            answer = self.read()
            if isinstance(answer, Frame) and answer.kind == GOAWAY:
                if answer.code not in codes:
                    raise Failed(f"expected GOAWAY {_names(codes)}, got {answer}")
                if self._drain() != CLOSED:
                    raise Failed("GOAWAY came but the connection stayed open")
                return
            if not isinstance(answer, Frame):
                raise Failed(f"expected GOAWAY {_names(codes)}, got {answer}")

    def expect_stream_error(self, *codes: int, stream: int = 1, unserved: bool = False
                            ) -> None:
        """RST_STREAM on `stream` (or GOAWAY) with one of `codes`; with `unserved`, the
        stream must not have been answered with a response first."""
        while True:
            answer = self.read()
            if not isinstance(answer, Frame):
                raise Failed(f"expected RST_STREAM {_names(codes)}, got {answer}")
            if answer.kind in (RST_STREAM, GOAWAY):
                if answer.kind == RST_STREAM and answer.stream != stream:
                    continue
                if answer.code not in codes:
                    raise Failed(f"expected RST_STREAM {_names(codes)}, got {answer}")
                return
            if unserved and answer.kind == HEADERS and answer.stream == stream:
                raise Failed(f"expected RST_STREAM {_names(codes)}, but the stream was "
                             f"answered: {answer}")

    def expect_response(self, stream: int = 1) -> Frame:
        """A HEADERS frame answering `stream`."""
        answer = self.wait_for(HEADERS)
        if answer.stream != stream:
            raise Failed(f"expected HEADERS on stream {stream}, got {answer}")
        return answer

    def expect_served(self, stream: int = 1) -> None:
        """The call's answer ends with grpc-status 0."""
        decoder = hpack.Decoder()
        while True:
            answer = self.read()
            if not isinstance(answer, Frame):
                raise Failed(f"expected the call's answer, got {answer}")
            if answer.kind == RST_STREAM and answer.stream == stream:
                raise Failed(f"expected the call's answer, got {answer}")
            if answer.kind == HEADERS and answer.stream == stream:
                fields = dict(decoder.decode(answer.payload))
                if answer.flags & END_STREAM:
                    if fields.get("grpc-status") != "0":
                        raise Failed(f"the call ended with {fields}")
                    return

    def expect_ping_ack(self, payload: bytes = b"h2-conf!") -> None:
        """Sends a PING; its acknowledgement must be the first PING back."""
        self.ping(payload)
        answer = self.wait_for(PING)
        if not answer.flags & ACK or answer.payload != payload:
            raise Failed(f"expected PING ACK {payload!r}, got {answer} {answer.payload!r}")

    def expect_ping_ack_or_close(self) -> None:
        self.ping()
        while True:
            answer = self.read()
            if answer == CLOSED:
                return
            if not isinstance(answer, Frame):
                raise Failed(f"expected PING ACK or the close, got {answer}")
            if answer.kind == PING and answer.flags & ACK:
                if answer.payload != b"h2-conf!":
                    raise Failed(f"a PING ACK with {answer.payload!r}")
                return

    def expect_settings_ack(self) -> None:
        answer = self.wait_for(SETTINGS)
        if not answer.flags & ACK:
            raise Failed(f"expected SETTINGS ACK, got {answer}")

    def expect_data(self, length: int | None = None, stream: int = 1) -> None:
        answer = self.wait_for(DATA)
        if answer.stream != stream or (length is not None and len(answer.payload) != length):
            raise Failed(f"expected DATA of {length} octets on stream {stream}, got {answer} "
                         f"of {len(answer.payload)}")

    def expect_stream_end(self, stream: int = 1) -> None:
        """The stream ends (END_STREAM, or RST_STREAM NO_ERROR), as h2spec's StreamClose."""
        while True:
            answer = self.read()
            if not isinstance(answer, Frame):
                raise Failed(f"expected stream {stream} to end, got {answer}")
            if answer.stream == stream and (
                    (answer.kind in (HEADERS, DATA) and answer.flags & END_STREAM)
                    or (answer.kind == RST_STREAM and answer.code == ErrorCodes.NO_ERROR)):
                return

    def expect_close(self) -> None:
        if self._drain() != CLOSED:
            raise Failed("expected the connection to close; it stayed open")

    def _drain(self) -> str:
        while isinstance(answer := self.read(), Frame):
            pass
        return answer


def priority_field(depends_on: int, weight: int = 255, exclusive: bool = False) -> bytes:
    return ((depends_on | (0x80000000 if exclusive else 0)).to_bytes(4, "big")
            + bytes((weight - 1 if weight > 0 else 0,)))


def integer(value: int, prefix_bits: int, flags: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with `flags` in the first octet's other bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out, value = [flags | limit], value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def huffman_string(text: bytes, extra: bytes = b"", zero_padding: bool = False,
                   eos: bool = False) -> bytes:
    """An HPACK string literal, Huffman-coded (RFC 7541 5.2) with the code table of
    python-hyper's hpack; `extra` octets after it, its padding as zeros, or the EOS
    symbol inside it break it on purpose."""
    from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

    symbols = [*text, 256, *b"st"] if eos else list(text)
    value, bits = 0, 0
    for symbol in symbols:
        value = value << REQUEST_CODES_LENGTH[symbol] | REQUEST_CODES[symbol]
        bits += REQUEST_CODES_LENGTH[symbol]
    pad = -bits % 8
    if zero_padding and not pad:
        raise ValueError("this text leaves no padding to zero")
    value = value << pad | (0 if zero_padding else (1 << pad) - 1)
    coded = value.to_bytes((bits + pad) // 8, "big") + extra
    return integer(len(coded), 7, 0x80) + coded


def _names(codes: tuple[int, ...]) -> str:
    return " or ".join(code_name(code) for code in codes)


class _EmptyRuntime:
    """A RouterRuntime whose one application is never called: the conformance table's
    calls are the port's own services (Healthz answers OK once a route exists)."""

    routes = RouteTable((RouteTarget("app", "Ingress", "/app"),))

    def router(self, deployment: object) -> object:
        return object()  # the route's, compiled with the table; nothing is sent to it


@contextmanager
def serving(reflection: bool = True) -> Iterator[int]:
    """A surge gRPC port on 127.0.0.1, served from a thread; yields its port."""
    from surge.proxy.grpc import start_grpc
    from surge.proxy.server import Proxy
    from tests.e2e.grpc_echo_proto import SERVICER

    loop = asyncio.new_event_loop()
    started: list[tuple[asyncio.Server, object, int]] = []

    async def start() -> None:
        spec = ProxySpec("127.0.0.1", 0, None, 5.0, 1000)
        proxy = Proxy(_EmptyRuntime(), spec, metrics=False)  # type: ignore[arg-type]
        result = await start_grpc(proxy, "127.0.0.1", 0, (SERVICER,), None,
                                  reflection=reflection, health=True)
        assert result is not None
        started.append(result)

    loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, name="h2-conformance", daemon=True)
    thread.start()
    server, ingress, port = started[0]
    try:
        yield port
    finally:
        async def stop() -> None:
            ingress.close()  # type: ignore[attr-defined]
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
