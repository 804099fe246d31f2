"""The conformance table of surge's gRPC port: h2spec's cases, as gRPC calls.

h2spec 2.6 (github.com/summerwind/h2spec) checks a server against RFC 9113 (its
`generic` and `http2` groups) and RFC 7541 (`hpack`); it is a Go binary not on the
package registries here, so its cases are written again below, one per rule, named by
h2spec's group, section and description: all 147 of its cases at commit af83a65 (44
generic, 95 http2, 8 hpack). Each sends the frames the case sends, on a fresh connection,
with every request shaped as a gRPC call the port answers itself (Ray's Healthz: POST,
application/grpc, te: trailers, one empty message), and checks the answer as h2spec
does (a little more strictly: see tests/proxy/h2_client.py). Where h2spec opens a
stream with HEADERS and END_STREAM, a gRPC call sends its message first (HEADERS, then
DATA with END_STREAM); where it needs a stream the server has not answered yet
(half-closed (remote)), the client's window is set to 0 first, so the answer waits.

The `surge` group holds the rules h2spec has no case for that the issue (#32) names:
the other malformed fields of RFC 9113 8.2, GOAWAY's size, and the request each
malformed call makes is never served.

Most cases are rows of a `table`: a section, h2spec's description, and the steps the
client takes after the handshake, sends and checks alike (`do.rst(1)` is the step
`client.rst(1)`: tests/proxy/h2_client.py's `Client` has a method for each); a case with
logic of its own (a loop, a size read from the server's settings, its own check) is a
function under `@case`, in its place in h2spec's order.

`run_case` runs one case against a port and says why it failed (None: it passed);
tests/proxy/test_h2_conformance.py runs every case, bench/h2_conformance.py prints the
table by section.

(Long for a module: it is a table of 160 cases of a few lines each, in h2spec's order.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from tests.proxy.h2_client import (
    CALL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MESSAGE,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Client,
    Failed,
    huffman_string,
    integer,
    priority_field,
    setting,
)

__all__ = ["CASES", "Case", "run_case"]


@dataclass(frozen=True)
class Case:
    group: str  # generic | http2 | hpack (h2spec's) | surge (the extra rules)
    section: str
    name: str
    run: Callable[[Client], None]

    @property
    def id(self) -> str:
        return f"{self.group}/{self.section}/{self.name}"


CASES: list[Case] = []


def case(group: str, section: str, name: str) -> Callable[[Callable[[Client], None]],
                                                         Callable[[Client], None]]:
    def add(run: Callable[[Client], None]) -> Callable[[Client], None]:
        CASES.append(Case(group, section, name, run))
        return run
    return add


def run_case(item: Case, port: int, host: str = "127.0.0.1") -> str | None:
    with Client(port, host) as client:
        try:
            item.run(client)
        except Failed as exc:
            return str(exc)
    return None


def with_field(name: str, value: str) -> list[tuple[str, str]]:
    return [*CALL, (name, value)]


def without(name: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in CALL if k != name]


def half_closed(c: Client, stream: int = 1) -> None:
    """A call the server cannot finish answering: the client's window is 0."""
    c.settings((SettingCodes.INITIAL_WINDOW_SIZE, 0))
    c.expect_settings_ack()
    c.call(stream)


def malformed(headers: list[tuple[str, str]]) -> Callable[[Client], None]:
    def run(c: Client) -> None:
        c.handshake()
        c.call(1, headers)
        c.expect_stream_error(ErrorCodes.PROTOCOL_ERROR, unserved=True)
    return run


def served(c: Client, stream: int = 1) -> None:
    c.expect_served(stream)


Step = Callable[[Client], object]


class _Steps:
    """`do.NAME(*args)` is the step `client.NAME(*args)` of a case in a `table`."""

    def __getattr__(self, name: str) -> Callable[..., Step]:
        if not callable(getattr(Client, name, None)):
            raise AttributeError(f"Client has no method {name!r}")

        def step(*args: object, **kwargs: object) -> Step:
            return lambda c: getattr(c, name)(*args, **kwargs)
        return step


do = _Steps()


def table(group: str, rows: list[tuple[Any, ...]]) -> None:
    """A case for each row, (section, name, *steps): the handshake, then the steps in
    turn, sends and checks alike."""
    for section, name, *steps in rows:
        def run(c: Client, steps: list[Step] = steps) -> None:
            c.handshake()
            for step in steps:
                step(c)
        case(group, section, name)(run)


# == generic: what a server must accept =====================================================

table("generic", [
    ("1", "Sends a client connection preface"),
    ("2", "Sends a PRIORITY frame on idle stream",
     do.priority(1), do.expect_ping_ack()),
    ("2", "Sends a WINDOW_UPDATE frame on half-closed (remote) stream",
     half_closed, do.window_update(1, 1), do.expect_data(1)),
    ("2", "Sends a PRIORITY frame on half-closed (remote) stream",
     half_closed, do.priority(1), do.window_update(1, 1), do.expect_data(1)),
    ("2", "Sends a RST_STREAM frame on half-closed (remote) stream",
     half_closed, do.rst(1), do.expect_ping_ack_or_close()),
    ("2", "Sends a PRIORITY frame on closed stream",
     do.call(1), do.expect_stream_end(), do.priority(1), do.expect_ping_ack()),
    ("3.1", "Sends a DATA frame",
     do.call(1), do.expect_served()),
])


@case("generic", "3.1", "Sends multiple DATA frames")
def _(c: Client) -> None:
    c.handshake()
    c.headers(1)
    for at in range(len(MESSAGE)):
        c.data(1, MESSAGE[at:at + 1], end_stream=at == len(MESSAGE) - 1)
    served(c)


table("generic", [
    ("3.1", "Sends a DATA frame with padding",
     do.headers(1), do.frame(DATA, PADDED | END_STREAM, 1, b"\x08" + MESSAGE + b"\x00" * 8),
     do.expect_served()),
    ("3.2", "Sends a HEADERS frame",
     do.call(1), do.expect_response()),
    ("3.2", "Sends a HEADERS frame with padding",
     do.headers(1, flags=END_HEADERS | PADDED, before=b"\x08", after=b"\x00" * 8), do.data(1),
     do.expect_served()),
    ("3.2", "Sends a HEADERS frame with priority",
     do.headers(1, flags=END_HEADERS | PRIORITY_FLAG, before=priority_field(0, 255)), do.data(1),
     do.expect_served()),
])


def _priority_then_call(depends_on: int, weight: int, exclusive: bool = False
                        ) -> Callable[[Client], None]:
    def run(c: Client) -> None:
        c.handshake()
        c.priority(3, depends_on, weight, exclusive)
        c.call(3)
        served(c, 3)
    return run


for _name, _run in (
        ("Sends a PRIORITY frame with priority 1", _priority_then_call(0, 1)),
        ("Sends a PRIORITY frame with priority 256", _priority_then_call(0, 256)),
        ("Sends a PRIORITY frame with stream dependency", _priority_then_call(1, 255)),
        ("Sends a PRIORITY frame with exclusive", _priority_then_call(1, 255, True))):
    case("generic", "3.3", _name)(_run)


table("generic", [
    ("3.3", "Sends a PRIORITY frame for an idle stream, then send a HEADER frame for a lower "
            "stream ID",
     do.priority(3), do.call(1), do.expect_response()),
    ("3.4", "Sends a RST_STREAM frame",
     do.headers(1), do.rst(1), do.expect_ping_ack_or_close()),
    ("3.5", "Sends a SETTINGS frame",
     do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 65535)), do.expect_settings_ack()),
    ("3.7", "Sends a PING frame",
     do.expect_ping_ack()),
    ("3.8", "Sends a GOAWAY frame",
     do.frame(GOAWAY, 0, 0, bytes(8)), do.expect_ping_ack_or_close()),
    ("3.9", "Sends a WINDOW_UPDATE frame with stream ID 0",
     do.window_update(0, 1), do.expect_ping_ack()),
    ("3.9", "Sends a WINDOW_UPDATE frame with stream ID 1",
     do.headers(1), do.window_update(1, 1), do.data(1), do.expect_served()),
])


@case("generic", "3.10", "Sends a CONTINUATION frame")
def _(c: Client) -> None:
    c.handshake()
    block = c.block()
    c.headers(1, flags=0, block=block[:5])
    c.frame(CONTINUATION, END_HEADERS, 1, block[5:])
    c.data(1)
    served(c)


@case("generic", "3.10", "Sends multiple CONTINUATION frames")
def _(c: Client) -> None:
    c.handshake()
    block = c.block()
    c.headers(1, flags=0, block=block[:2])
    for at in range(2, len(block), 3):
        c.frame(CONTINUATION, END_HEADERS if at + 3 >= len(block) else 0, 1, block[at:at + 3])
    c.data(1)
    served(c)


table("generic", [
    ("4", "Sends a GET request",
     do.headers(1, [(":method", "GET"), *CALL[1:]], end_stream=True), do.expect_response()),
    ("4", "Sends a HEAD request",
     do.headers(1, [(":method", "HEAD"), *CALL[1:]], end_stream=True), do.expect_response()),
    ("4", "Sends a POST request",
     do.call(1), do.expect_served()),
    ("4", "Sends a POST request with trailers",
     do.headers(1), do.data(1, end_stream=False),
     do.headers(1, [("x-trailer", "yes")], end_stream=True), do.expect_served()),
])


def _hpack_case(name: str, field: bytes) -> None:
    """A call whose block carries one more field, encoded as the case says (RFC 7541)."""
    def run(c: Client) -> None:
        c.handshake()
        c.headers(1, block=c.block() + field)
        c.data(1)
        served(c)
    case("generic", "5", name)(run)


_HUFFMAN_TEST = huffman_string(b"test")
for _name, _field in (
        ("Sends a indexed header field representation", b"\x8f"),  # accept-encoding
        ("Sends a literal header field with incremental indexing - indexed name",
         b"\x50\x04test"),  # accept-encoding: test
        ("Sends a literal header field with incremental indexing - indexed name "
         "(with Huffman coding)", b"\x50" + _HUFFMAN_TEST),
        ("Sends a literal header field with incremental indexing - new name",
         b"\x40\x06x-test\x04test"),
        ("Sends a literal header field with incremental indexing - new name "
         "(with Huffman coding)", b"\x40" + _HUFFMAN_TEST + _HUFFMAN_TEST),
        ("Sends a literal header field without indexing - indexed name", b"\x0f\x01\x04test"),
        ("Sends a literal header field without indexing - indexed name (with Huffman coding)",
         b"\x0f\x01" + _HUFFMAN_TEST),
        ("Sends a literal header field without indexing - new name",
         b"\x00\x06x-test\x04test"),
        ("Sends a literal header field without indexing - new name (huffman encoded)",
         b"\x00" + _HUFFMAN_TEST + _HUFFMAN_TEST),
        ("Sends a literal header field never indexed - indexed name", b"\x1f\x01\x04test"),
        ("Sends a literal header field never indexed - indexed name (huffman encoded)",
         b"\x1f\x01" + _HUFFMAN_TEST),
        ("Sends a literal header field never indexed - new name", b"\x10\x06x-test\x04test"),
        ("Sends a literal header field never indexed - new name (huffman encoded)",
         b"\x10" + _HUFFMAN_TEST + _HUFFMAN_TEST)):
    _hpack_case(_name, _field)


table("generic", [
    ("5", "Sends a dynamic table size update",
     do.headers(1, before=b"\x3f\xe1\x1f"), do.data(1), do.expect_served()),  # size 4096
    ("5", "Sends multiple dynamic table size update",
     do.headers(1, before=b"\x20\x3f\xe1\x1f"), do.data(1),  # 0, then 4096
     do.expect_served()),
])


# == hpack: decoding errors are COMPRESSION_ERROR ===========================================

def _compression_error(section: str, name: str, field: bytes) -> None:
    def run(c: Client) -> None:
        c.handshake()
        c.headers(1, block=c.block() + field)
        c.expect_connection_error(ErrorCodes.COMPRESSION_ERROR)
    case("hpack", section, name)(run)


_NAME = b"\x00" + huffman_string(b"x-test")  # a literal, new name, without indexing
_compression_error("2.3.3", "Sends a indexed header field representation with invalid index",
                   integer(1000, 7, 0x80))  # past the static and dynamic tables
_compression_error("2.3.3", "Sends a literal header field representation with invalid index",
                   integer(1000, 6, 0x40) + b"\x04test")
_compression_error("4.2", "Sends a dynamic table size update at the end of header block",
                   integer(1, 5, 0x20))
_compression_error("5.2", "Sends a Huffman-encoded string literal representation with "
                          "padding longer than 7 bits", _NAME + huffman_string(b"test", b"\xff"))
_compression_error("5.2", "Sends a Huffman-encoded string literal representation padded by "
                          "zero", _NAME + huffman_string(b"test", zero_padding=True))
_compression_error("5.2", "Sends a Huffman-encoded string literal representation containing "
                          "the EOS symbol", _NAME + huffman_string(b"te", eos=True))
_compression_error("6.1", "Sends a indexed header field representation with index 0", b"\x80")


table("hpack", [
    ("6.3", "Sends a dynamic table size update larger than the value of SETTINGS_HEADER_TABLE_SIZE",
     do.headers(1, before=integer(4097, 5, 0x20)),
     do.expect_connection_error(ErrorCodes.COMPRESSION_ERROR)),
])


# == http2: RFC 9113 ========================================================================

@case("http2", "3.5", "Sends client connection preface")
def _(c: Client) -> None:
    c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, SETTINGS, 0, 0, 0, 0, 0)))
    answer = c.read()
    if not (getattr(answer, "kind", None) == SETTINGS and not getattr(answer, "flags", 1)):
        raise Failed(f"expected SETTINGS as the server's first frame, got {answer}")


@case("http2", "3.5", "Sends invalid connection preface")
def _(c: Client) -> None:
    c.send(b"INVALID CONNECTION PREFACE\r\n\r\n")
    while True:  # the server's own SETTINGS and WINDOW_UPDATE may come first
        answer = c.read()
        if getattr(answer, "kind", None) not in (SETTINGS, WINDOW_UPDATE):
            break
    if getattr(answer, "kind", None) != GOAWAY or getattr(answer, "code", None) != \
            ErrorCodes.PROTOCOL_ERROR:
        raise Failed(f"expected GOAWAY PROTOCOL_ERROR, got {answer}")
    c.expect_close()


table("http2", [
    ("4.1", "Sends a frame with unknown type",
     do.frame(0x16, 0, 0, b"unknown!"), do.expect_ping_ack()),
    ("4.1", "Sends a frame with undefined flag",
     do.frame(PING, 0x16, 0, b"h2-conf!"), do.wait_for(PING)),
    ("4.1", "Sends a frame with reserved field bit",
     do.send(bytes((0, 0, 8, PING, 0, 0x80, 0, 0, 0)) + b"h2-conf!"), do.wait_for(PING)),
])


@case("http2", "4.2", "Sends a DATA frame with 2^14 octets in length")
def _(c: Client) -> None:
    c.handshake()
    c.headers(1)
    body = bytes(2**14 - 5)
    c.data(1, len(body).to_bytes(5, "big") + body)
    served(c)


@case("http2", "4.2", "Sends a large size DATA frame that exceeds the SETTINGS_MAX_FRAME_SIZE")
def _(c: Client) -> None:
    c.handshake()
    c.headers(1)
    size = c.server_settings.get(SettingCodes.MAX_FRAME_SIZE, 2**14) + 1
    # Its header and a little of its payload: the length alone is the error, and a
    # server that closes with megabytes unread resets the connection under its GOAWAY.
    c.send(size.to_bytes(3, "big") + bytes((DATA, END_STREAM)) + (1).to_bytes(4, "big")
           + bytes(64))
    c.expect_stream_error(ErrorCodes.FRAME_SIZE_ERROR)


@case("http2", "4.2", "Sends a large size HEADERS frame that exceeds the "
                      "SETTINGS_MAX_FRAME_SIZE")
def _(c: Client) -> None:
    c.handshake()
    size = c.server_settings.get(SettingCodes.MAX_FRAME_SIZE, 2**14) + 1
    c.send(size.to_bytes(3, "big") + bytes((HEADERS, END_HEADERS | END_STREAM))
           + (1).to_bytes(4, "big") + c.block())  # as DATA above: the length is the error
    c.expect_connection_error(ErrorCodes.FRAME_SIZE_ERROR)


table("http2", [
    ("4.3", "Sends invalid header block fragment",
     do.headers(1, block=b"\x40", end_stream=True),  # a literal cut short
     do.expect_connection_error(ErrorCodes.COMPRESSION_ERROR)),
    ("4.3", "Sends a PRIORITY frame while sending the header blocks",
     do.headers(1, flags=0), do.priority(1), do.continuation(1, [("x-dummy", "x")]),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("4.3", "Sends a HEADERS frame to another stream while sending the header blocks",
     do.headers(1, flags=0), do.headers(3), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("5.1.1", "Sends even-numbered stream identifier",
     do.call(2), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("5.1.1", "Sends stream identifier that is numerically smaller than previous",
     do.call(5), do.call(3), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
])


@case("http2", "5.1.2", "Sends HEADERS frames that causes their advertised concurrent stream "
                        "limit to be exceeded")
def _(c: Client) -> None:
    c.handshake()
    limit = c.server_settings.get(SettingCodes.MAX_CONCURRENT_STREAMS)
    if limit is None:
        raise Failed("the server advertises no SETTINGS_MAX_CONCURRENT_STREAMS")
    c.send(b"".join(_frame(HEADERS, END_HEADERS, 2 * i + 1, c.block())
                    for i in range(limit + 1)))
    c.expect_stream_error(ErrorCodes.PROTOCOL_ERROR, ErrorCodes.REFUSED_STREAM,
                          stream=2 * limit + 1)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")
            + payload)


table("http2", [
    ("5.1", "idle: Sends a DATA frame",
     do.data(1), do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR, ErrorCodes.STREAM_CLOSED)),
    ("5.1", "idle: Sends a RST_STREAM frame",
     do.rst(1), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("5.1", "idle: Sends a WINDOW_UPDATE frame",
     do.window_update(1, 100), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("5.1", "idle: Sends a CONTINUATION frame",
     do.continuation(1), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("5.1", "half closed (remote): Sends a DATA frame",
     half_closed, do.data(1, b"test"), do.expect_stream_error(ErrorCodes.STREAM_CLOSED)),
    ("5.1", "half closed (remote): Sends a HEADERS frame",
     half_closed, do.headers(1, end_stream=True), do.expect_stream_error(ErrorCodes.STREAM_CLOSED)),
    ("5.1", "half closed (remote): Sends a CONTINUATION frame",
     half_closed, do.continuation(1, [("x-dummy", "x")]),
     do.expect_stream_error(ErrorCodes.STREAM_CLOSED, ErrorCodes.PROTOCOL_ERROR)),
    ("5.1", "closed: Sends a DATA frame after sending RST_STREAM frame",
     do.headers(1), do.rst(1), do.data(1, b"test"),
     do.expect_stream_error(ErrorCodes.STREAM_CLOSED)),
    ("5.1", "closed: Sends a HEADERS frame after sending RST_STREAM frame",
     do.headers(1), do.rst(1), do.headers(1, end_stream=True),
     do.expect_stream_error(ErrorCodes.STREAM_CLOSED)),
    ("5.1", "closed: Sends a CONTINUATION frame after sending RST_STREAM frame",
     do.headers(1), do.rst(1), do.continuation(1, [("x-dummy", "x")]),
     do.expect_stream_error(ErrorCodes.STREAM_CLOSED, ErrorCodes.PROTOCOL_ERROR)),
    ("5.1", "closed: Sends a DATA frame",
     do.call(1), do.expect_stream_end(), do.data(1, b"test"),
     do.expect_stream_error(ErrorCodes.STREAM_CLOSED)),
    ("5.1", "closed: Sends a HEADERS frame",
     do.call(1), do.expect_stream_end(), do.headers(1, end_stream=True),
     do.expect_connection_error(ErrorCodes.STREAM_CLOSED)),
    ("5.1", "closed: Sends a CONTINUATION frame",
     do.call(1), do.expect_stream_end(), do.continuation(1, [("x-dummy", "x")]),
     do.expect_connection_error(ErrorCodes.STREAM_CLOSED, ErrorCodes.PROTOCOL_ERROR)),
    ("5.3.1", "Sends HEADERS frame that depends on itself",
     do.headers(1, flags=END_HEADERS | PRIORITY_FLAG, before=priority_field(1)), do.data(1),
     do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
    ("5.3.1", "Sends PRIORITY frame that depend on itself",
     do.priority(1, depends_on=1), do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
    ("5.4.1", "Sends an invalid PING frame for connection close",
     do.frame(PING, 0, 0, b"123456"), do.expect_close()),
    ("5.4.1", "Sends an invalid PING frame to receive GOAWAY frame",
     do.frame(PING, 0, 0, b"123456"), do.wait_for(GOAWAY)),
    ("5.5", "Sends an unknown extension frame",
     do.frame(0xFF, 0, 0, b"unknown!"), do.expect_ping_ack()),
    ("5.5", "Sends an unknown extension frame in the middle of a header block",
     do.headers(1, flags=0), do.frame(0xFF, 0, 1, b"unknown!"),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.1", "Sends a DATA frame with 0x0 stream identifier",
     do.data(0, b"test"), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.1", 'Sends a DATA frame on the stream that is not in "open" or "half-closed (local)" state',
     do.call(1), do.data(1, b"test"), do.expect_stream_error(ErrorCodes.STREAM_CLOSED)),
    ("6.1", "Sends a DATA frame with invalid pad length",
     do.headers(1), do.frame(DATA, PADDED | END_STREAM, 1, b"\x06test"),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.2", "Sends a HEADERS frame without the END_HEADERS flag, and a PRIORITY frame",
     do.headers(1, flags=0), do.priority(1), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.2", "Sends a HEADERS frame to another stream while sending a HEADERS frame",
     do.headers(1, flags=0), do.headers(3), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.2", "Sends a HEADERS frame with 0x0 stream identifier",
     do.headers(0), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
])


@case("http2", "6.2", "Sends a HEADERS frame with invalid pad length")
def _(c: Client) -> None:
    c.handshake()
    block = c.block()
    c.headers(1, flags=END_HEADERS | PADDED, block=bytes((len(block) + 1,)) + block)
    c.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)


def wrong_size_on_a_stream(kind: int, payload: bytes) -> list[Step]:
    """A frame of `kind` on an open stream whose payload is not the size its kind has: a
    stream error, FRAME_SIZE_ERROR (RFC 9113 6.3, 6.4)."""
    return [do.headers(1), do.frame(kind, 0, 1, payload),
            do.expect_stream_error(ErrorCodes.FRAME_SIZE_ERROR)]


table("http2", [
    ("6.3", "Sends a PRIORITY frame with 0x0 stream identifier",
     do.priority(0), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.3", "Sends a PRIORITY frame with a length other than 5 octets",
     *wrong_size_on_a_stream(PRIORITY, b"\x80\x00\x00\x01")),
    ("6.4", "Sends a RST_STREAM frame with 0x0 stream identifier",
     do.rst(0), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.4", "Sends a RST_STREAM frame on a idle stream",
     do.rst(1), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.4", "Sends a RST_STREAM frame with a length other than 4 octets",
     *wrong_size_on_a_stream(RST_STREAM, b"\x00\x00\x00")),
    ("6.5", "Sends a SETTINGS frame with ACK flag and payload",
     do.frame(SETTINGS, 1, 0, b"\x00" * 6),
     do.expect_connection_error(ErrorCodes.FRAME_SIZE_ERROR)),
    ("6.5", "Sends a SETTINGS frame with a stream identifier other than 0x0",
     do.frame(SETTINGS, 0, 1, setting(SettingCodes.INITIAL_WINDOW_SIZE, 100)),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.5", "Sends a SETTINGS frame with a length other than a multiple of 6 octets",
     do.frame(SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00\x64\x00"),
     do.expect_connection_error(ErrorCodes.FRAME_SIZE_ERROR)),
])


def _bad_setting(name: str, key: int, value: int, code: int) -> None:
    def run(c: Client) -> None:
        c.handshake()
        c.settings((key, value))
        c.expect_connection_error(code)
    case("http2", "6.5.2", name)(run)


_bad_setting("SETTINGS_ENABLE_PUSH (0x2): Sends the value other than 0 or 1",
             SettingCodes.ENABLE_PUSH, 2, ErrorCodes.PROTOCOL_ERROR)
_bad_setting("SETTINGS_INITIAL_WINDOW_SIZE (0x4): Sends the value above the maximum flow "
             "control window size", SettingCodes.INITIAL_WINDOW_SIZE, 2**31,
             ErrorCodes.FLOW_CONTROL_ERROR)
_bad_setting("SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value below the initial value",
             SettingCodes.MAX_FRAME_SIZE, 2**14 - 1, ErrorCodes.PROTOCOL_ERROR)
_bad_setting("SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value above the maximum allowed frame "
             "size", SettingCodes.MAX_FRAME_SIZE, 2**24, ErrorCodes.PROTOCOL_ERROR)


table("http2", [
    ("6.5.2", "Sends a SETTINGS frame with unknown identifier",
     do.settings((0xFF, 1)), do.expect_ping_ack()),
    ("6.5.3", "Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE",
     do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 100), (SettingCodes.INITIAL_WINDOW_SIZE, 1)),
     do.expect_settings_ack(), do.call(1), do.expect_data(1)),
    ("6.5.3", "Sends a SETTINGS frame without ACK flag",
     do.settings((SettingCodes.ENABLE_PUSH, 0)), do.expect_settings_ack()),
    ("6.7", "Sends a PING frame",
     do.expect_ping_ack()),
    ("6.7", "Sends a PING frame with ACK",
     do.ping(b"unwanted", flags=1),
     do.expect_ping_ack()),  # the first PING back answers this one, not the ACK sent
    ("6.7", "Sends a PING frame with a stream identifier field value other than 0x0",
     do.frame(PING, 0, 1, b"h2-conf!"), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.7", "Sends a PING frame with a length field value other than 8",
     do.frame(PING, 0, 0, b"123456"), do.expect_connection_error(ErrorCodes.FRAME_SIZE_ERROR)),
    ("6.8", "Sends a GOAWAY frame with a stream identifier other than 0x0",
     do.frame(GOAWAY, 0, 1, bytes(8)), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.9", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0",
     do.window_update(0, 0), do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.9", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0 on a stream",
     do.headers(1), do.window_update(1, 0), do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.9", "Sends a WINDOW_UPDATE frame with a length other than 4 octets",
     do.frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"),
     do.expect_connection_error(ErrorCodes.FRAME_SIZE_ERROR)),
    ("6.9.1", "Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame",
     do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 1)), do.expect_settings_ack(), do.call(1),
     do.expect_data(1)),
    ("6.9.1", "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above "
              "2^31-1",
     do.window_update(0, 2**31 - 1), do.window_update(0, 2**31 - 1),
     do.expect_connection_error(ErrorCodes.FLOW_CONTROL_ERROR)),
])


@case("http2", "6.9.1", "Sends multiple WINDOW_UPDATE frames increasing the flow control "
                        "window to above 2^31-1 on a stream")
def _(c: Client) -> None:
    c.handshake()
    c.headers(1)
    c.window_update(1, 2**31 - 1)
    c.window_update(1, 2**31 - 1)
    answer = c.wait_for(RST_STREAM)
    if answer.stream != 1 or answer.code != ErrorCodes.FLOW_CONTROL_ERROR:
        raise Failed(f"expected RST_STREAM FLOW_CONTROL_ERROR on stream 1, got {answer}")


table("http2", [
    ("6.9.2", "Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame",
     do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 0)), do.expect_settings_ack(), do.call(1),
     do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 1)), do.expect_data(1)),
    ("6.9.2", "Sends a SETTINGS frame for window size to be negative",
     do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 3)), do.expect_settings_ack(), do.call(1),
     do.expect_data(3), do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 2)),
     do.expect_settings_ack(), do.window_update(1, 2),  # the window: 3 - 3 - 1 + 2
     do.expect_data(1)),
    ("6.9.2", "Sends a SETTINGS_INITIAL_WINDOW_SIZE settings with an exceeded maximum window size "
              "value",
     do.settings((SettingCodes.INITIAL_WINDOW_SIZE, 2**31)),
     do.expect_connection_error(ErrorCodes.FLOW_CONTROL_ERROR)),
])


@case("http2", "6.10", "Sends multiple CONTINUATION frames preceded by a HEADERS frame")
def _(c: Client) -> None:
    c.handshake()
    block = c.block()
    c.headers(1, flags=0, block=block)
    c.frame(CONTINUATION, 0, 1, c.block([("x-dummy1", "x")]))
    c.frame(CONTINUATION, END_HEADERS, 1, c.block([("x-dummy2", "x")]))
    c.data(1)
    served(c)


table("http2", [
    ("6.10", "Sends a CONTINUATION frame followed by any frame other than CONTINUATION",
     do.headers(1, flags=0), do.continuation(1, [("x-dummy1", "x")], flags=0), do.data(1),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.10", "Sends a CONTINUATION frame with 0x0 stream identifier",
     do.headers(1, flags=0), do.continuation(0, [("x-dummy1", "x")]),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.10", "Sends a CONTINUATION frame preceded by a HEADERS frame with END_HEADERS flag",
     do.headers(1), do.continuation(1, [("x-dummy1", "x")]),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.10", "Sends a CONTINUATION frame preceded by a CONTINUATION frame with END_HEADERS flag",
     do.headers(1, flags=0), do.continuation(1, [("x-dummy1", "x")]),
     do.continuation(1, [("x-dummy2", "x")]),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("6.10", "Sends a CONTINUATION frame preceded by a DATA frame",
     do.headers(1), do.data(1, end_stream=False), do.continuation(1, [("x-dummy1", "x")]),
     do.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)),
    ("7", "Sends a GOAWAY frame with unknown error code",
     do.frame(GOAWAY, 0, 0, bytes(4) + (0xFF).to_bytes(4, "big")), do.expect_ping_ack_or_close()),
    ("7", "Sends a RST_STREAM frame with unknown error code",
     do.headers(1), do.rst(1, 0xFF), do.expect_ping_ack_or_close()),
    ("8.1", "Sends a second HEADERS frame without the END_STREAM flag",
     do.headers(1), do.data(1, end_stream=False), do.headers(1, [("x-trailer", "yes")]),
     do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
])


for _section, _name, _fields in (
        ("8.1.2", "Sends a HEADERS frame that contains the header field name in uppercase "
                  "letters", with_field("X-TEST", "ok")),
        ("8.1.2.1", "Sends a HEADERS frame that contains a unknown pseudo-header field",
         [(":test", "ok"), *CALL]),
        ("8.1.2.1", "Sends a HEADERS frame that contains the pseudo-header field defined for "
                    "response", [*CALL[:4], (":status", "200"), *CALL[4:]]),
        ("8.1.2.1", "Sends a HEADERS frame that contains a pseudo-header field that appears in "
                    "a header block after a regular header field",
         [*CALL, (":authority", "localhost")]),
        ("8.1.2.2", "Sends a HEADERS frame that contains the connection-specific header field",
         with_field("connection", "keep-alive")),
        ("8.1.2.2", 'Sends a HEADERS frame that contains the TE header field with any value '
                    'other than "trailers"', [*without("te"), ("te", "trailers, deflate")]),
        ("8.1.2.3", 'Sends a HEADERS frame with empty ":path" pseudo-header field',
         [(k, "" if k == ":path" else v) for k, v in CALL]),
        ("8.1.2.3", 'Sends a HEADERS frame that omits ":method" pseudo-header field',
         without(":method")),
        ("8.1.2.3", 'Sends a HEADERS frame that omits ":scheme" pseudo-header field',
         without(":scheme")),
        ("8.1.2.3", 'Sends a HEADERS frame that omits ":path" pseudo-header field',
         without(":path")),
        ("8.1.2.3", 'Sends a HEADERS frame with duplicated ":method" pseudo-header field',
         [(":method", "POST"), *CALL]),
        ("8.1.2.3", 'Sends a HEADERS frame with duplicated ":scheme" pseudo-header field',
         [(":scheme", "http"), *CALL]),
        ("8.1.2.3", 'Sends a HEADERS frame with duplicated ":path" pseudo-header field',
         [(":path", "/grpc.health.v1.Health/Check"), *CALL])):
    case("http2", _section, _name)(malformed(_fields))


table("http2", [
    ("8.1.2.1", "Sends a HEADERS frame that contains a pseudo-header field as trailers",
     do.headers(1), do.data(1, end_stream=False),
     do.headers(1, [(":path", "/other")], end_stream=True),
     do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
    ("8.1.2.6", 'Sends a HEADERS frame with the "content-length" header field which does not equal '
                'the DATA frame payload length',
     do.headers(1, with_field("content-length", "1")), do.data(1),
     do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
    ("8.1.2.6", 'Sends a HEADERS frame with the "content-length" header field which does not equal '
                'the sum of the multiple DATA frames payload length',
     do.headers(1, with_field("content-length", "12")), do.data(1, end_stream=False), do.data(1),
     do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
])


@case("http2", "8.2", "Sends a PUSH_PROMISE frame")
def _(c: Client) -> None:
    c.handshake()
    c.headers(1)
    c.frame(PUSH_PROMISE, END_HEADERS, 1, (2).to_bytes(4, "big") + c.block())
    c.expect_connection_error(ErrorCodes.PROTOCOL_ERROR)


# == surge: the rules of RFC 9113 8.2 and 6.8 that h2spec has no case for ===================

for _name, _fields in (
        ("a keep-alive field", with_field("keep-alive", "timeout=5")),
        ("a proxy-connection field", with_field("proxy-connection", "keep-alive")),
        ("a transfer-encoding field", with_field("transfer-encoding", "chunked")),
        ("an upgrade field", with_field("upgrade", "h2c")),
        ("a CR LF inside a value", with_field("x-test", "a\r\nx-evil: yes")),
        ("a NUL inside a value", with_field("x-test", "a\x00b")),
        ("a value with leading whitespace", with_field("x-test", " a")),
        ("a value with trailing whitespace", with_field("x-test", "a\t")),
        ("a field name with a space", with_field("x test", "a")),
        ("a pseudo-header value with a CR", [(k, v + "\r" if k == ":path" else v)
                                             for k, v in CALL])):
    case("surge", "8.2", f"A call with {_name} is refused")(malformed(_fields))


table("surge", [
    ("8.1", "Trailers with a connection-specific field end the stream",
     do.headers(1), do.data(1, end_stream=False),
     do.headers(1, [("connection", "close")], end_stream=True),
     do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR)),
    ("8.1", "A well-formed call on the same connection is served after a refusal",
     do.call(1, with_field("X-TEST", "ok")),
     do.expect_stream_error(ErrorCodes.PROTOCOL_ERROR, unserved=True), do.call(3),
     do.expect_served(3)),
    ("6.8", "Sends a GOAWAY frame shorter than 8 octets",
     do.frame(GOAWAY, 0, 0, bytes(4)), do.expect_connection_error(ErrorCodes.FRAME_SIZE_ERROR)),
])
