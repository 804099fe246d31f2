"""gRPC over HTTP/2, sans I/O: a request's headers read, messages framed and deframed,
the response's header blocks written (the gRPC HTTP/2 protocol, PROTOCOL-HTTP2.md).

A message on the wire is one byte (compressed or not), four of length, then the
message. A client may compress its messages with gzip or deflate (grpc's own server
takes both; the proxy inflates them, bounded by the message limit, so the replica still
gets plain bytes); another `grpc-encoding` is answered UNIMPLEMENTED, as grpc does. The
ingress answers uncompressed (identity), which every client takes.
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass, field

from surge.codecs.hpack import Header, literal

__all__ = ["ACCEPT_ENCODING", "RESPONSE_HEADERS", "CallHead", "MessageReader", "WireError",
           "frame_message", "http_error", "read_head", "trailers"]

Metadata = tuple[tuple[str, str | bytes], ...]
RESPONSE_HEADERS = b"\x88" + literal(b"content-type", b"application/grpc")  # :status 200
# Headers grpc keeps for itself: they are not the call's metadata.
_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                       b"grpc-accept-encoding", b"grpc-message-type", b"host"))
_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6,
          ord("n"): 1e-9}
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}
# zlib's window bits for each grpc-encoding the proxy inflates (0: not compressed).
ENCODINGS = {b"identity": 0, b"gzip": 31, b"deflate": 15}
ACCEPT_ENCODING = "identity,deflate,gzip"  # grpc-accept-encoding, with an UNIMPLEMENTED
# Trailing metadata a method may set: lowercase names of these characters, not the
# names gRPC and HTTP/2 keep for themselves.
_KEY = re.compile(rb"[0-9a-z_.\-]+")
_TEXT = re.compile(rb"[\x20-\x7e]*")
_OWN_KEYS = frozenset((b"grpc-status", b"grpc-message", b"grpc-status-details-bin",
                       b"content-type", b"te", b"content-length", b"transfer-encoding",
                       b"connection"))


class WireError(ValueError):
    """A request gRPC cannot serve: `code` (a grpc status number) and why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class CallHead:
    path: str = ""
    metadata: Metadata = ()
    timeout_s: float | None = None
    encoding: int = 0  # ENCODINGS' window bits of the client's compression
    errors: list[WireError] = field(default_factory=list)


def read_head(headers: list[Header]) -> CallHead:
    """The call a request's headers open; `errors` holds why it cannot be served (the
    first decides its answer): not POST, not application/grpc, a bad timeout, a
    compression this side does not speak."""
    head = CallHead()
    metadata: list[tuple[str, str | bytes]] = []
    method = b""
    content_type = b""
    for name, value in headers:
        if name[:1] == b":":
            if name == b":path":
                head.path = value.decode("latin-1")
            elif name == b":method":
                method = value
            continue
        if name in _RESERVED:
            if name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                head.timeout_s = _timeout(value, head)
            elif name == b"grpc-encoding":
                bits = ENCODINGS.get(value)
                if bits is None:
                    head.errors.append(WireError(12, f"grpc-encoding {value.decode('latin-1')}"
                                                     " is not supported (identity, gzip, "
                                                     "deflate)"))
                head.encoding = bits or 0
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            metadata.append((key, _unbase64(value)))
        else:
            metadata.append((key, value.decode("latin-1")))
    if method != b"POST":
        head.errors.insert(0, WireError(-405, "gRPC calls are POSTs"))
    elif not content_type.startswith(b"application/grpc"):
        head.errors.insert(0, WireError(-415, "not a gRPC request (content-type "
                                              f"{content_type.decode('latin-1')!r})"))
    head.metadata = tuple(metadata)
    return head


def _timeout(value: bytes, head: CallHead) -> float | None:
    """grpc-timeout: up to 8 digits and a unit (H M S m u n)."""
    unit = _UNITS.get(value[-1]) if value else None
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        head.errors.append(WireError(13, f"malformed grpc-timeout {value.decode('latin-1')!r}"))
        return None
    return int(digits) * unit


def _unbase64(value: bytes) -> bytes:
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4))
    except ValueError:
        return value


def frame_message(body: bytes) -> list[bytes]:
    """A response message on the wire: one buffer, or the prefix then a large body as is."""
    prefix = b"\x00" + len(body).to_bytes(4, "big")
    if len(body) < 65536:
        return [prefix + body]
    return [prefix, body]


def trailers(code: int, details: str, metadata: Metadata, trailers_only: bool) -> bytes:
    """The call's last header block: status, message, then its trailing metadata;
    `trailers_only` (no response headers went before) puts :status in front. Metadata
    HTTP/2 cannot carry is left out (a name that is not lowercase letters, digits and
    -_., one gRPC keeps for itself, a text value with a byte outside printable ASCII),
    so one method's bad trailer fails neither its call nor its connection."""
    parts = [RESPONSE_HEADERS] if trailers_only else []
    status = _STATUS.get(code)
    if status is None:
        status = literal(b"grpc-status", str(code).encode())
    parts.append(status)
    if details:
        parts.append(literal(b"grpc-message", _percent(details)))
    for key, value in metadata:
        name = _names.get(key, b"")
        if name == b"":
            name = _name(key)
        if name is None:
            continue
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            encoded = base64.b64encode(raw).rstrip(b"=")
        else:
            encoded = value if isinstance(value, bytes) else value.encode("utf-8")
            if not _TEXT.fullmatch(encoded):
                continue
        parts.append(literal(name, encoded))
    return b"".join(parts)


_STATUS = {code: literal(b"grpc-status", str(code).encode()) for code in range(17)}
_names: dict[str, bytes | None] = {}  # metadata keys seen, as sent (None: left out)


def _name(key: str) -> bytes | None:
    """A metadata key as sent, or None if HTTP/2 cannot carry it (remembered)."""
    name = key.lower().encode("ascii", "replace")
    kept = name if _KEY.fullmatch(name) and name not in _OWN_KEYS else None
    if len(_names) >= 1024:
        _names.clear()
    _names[key] = kept
    return kept


def http_error(status: int, text: str) -> bytes:
    """A non-gRPC answer's header block (415, 405) with the reason in grpc-message."""
    return (literal(b":status", str(status).encode()) + literal(b"grpc-status", b"2")
            + literal(b"grpc-message", _percent(text)))


def _percent(text: str) -> bytes:
    """grpc-message's encoding: UTF-8, printable ASCII as is, the rest (and %) as %XX."""
    raw = text.encode()
    if all(octet in _PLAIN for octet in raw):
        return raw
    return b"".join(bytes((octet,)) if octet in _PLAIN else b"%%%02X" % octet for octet in raw)


class MessageReader:
    """Splits a stream's data into messages of at most `limit` bytes, inflating those the
    client compressed with its `grpc-encoding` (`encoding`: ENCODINGS' window bits)."""

    __slots__ = ("_chunks", "_compressed", "_got", "_head", "_need", "encoding", "limit")

    def __init__(self, limit: int, encoding: int = 0) -> None:
        self.limit = limit
        self.encoding = encoding
        self._compressed = False
        self._head = b""  # the prefix being read
        self._need = -1  # the message's bytes still to come (-1: reading a prefix)
        self._got = 0
        self._chunks: list[bytes | memoryview] = []

    @property
    def partial(self) -> bool:
        """A message has begun and not ended (the stream's end would cut it)."""
        return bool(self._head) or self._need >= 0

    def feed(self, data: bytes | memoryview) -> list[tuple[bytes, int]]:
        """The messages `data` completes, each with its size on the wire. Raises
        WireError for one too large (before or after inflating), compressed without an
        encoding, or that does not inflate."""
        messages: list[tuple[bytes, int]] = []
        view, pos, size = memoryview(data), 0, len(data)
        while pos < size:
            if self._need < 0:
                if not self._head and size - pos >= 5:  # the usual case: a whole prefix
                    head, pos = bytes(data[pos:pos + 5]), pos + 5
                else:
                    take = 5 - len(self._head)
                    self._head += bytes(data[pos:pos + take])
                    pos += take
                    if len(self._head) < 5:
                        break
                    head, self._head = self._head, b""
                compressed = bool(head[0])
                if compressed and not self.encoding:
                    raise WireError(13, "a compressed message without a grpc-encoding")
                length = int.from_bytes(head[1:5], "big")
                if length > self.limit:
                    raise WireError(8, f"a message of {length} bytes is larger than the limit "
                                       f"of {self.limit}")
                if size - pos >= length:  # the whole message is here
                    body = bytes(data[pos:pos + length])
                    messages.append((self._inflate(body) if compressed else body, length + 5))
                    pos += length
                    continue
                self._need, self._got, self._chunks = length, 0, []
                self._compressed = compressed
            take = min(self._need - self._got, size - pos)
            self._chunks.append(view[pos:pos + take])
            self._got += take
            pos += take
            if self._got == self._need:
                body = b"".join(self._chunks)
                messages.append((self._inflate(body) if self._compressed else body,
                                 self._need + 5))
                self._need, self._chunks = -1, []
        return messages

    def _inflate(self, body: bytes) -> bytes:
        inflater = zlib.decompressobj(self.encoding)
        try:
            plain = inflater.decompress(body, self.limit + 1)
        except zlib.error as exc:
            raise WireError(13, f"a compressed message that does not inflate: {exc}") from None
        if len(plain) > self.limit or inflater.unconsumed_tail:
            raise WireError(8, f"a message inflating past the limit of {self.limit} bytes")
        if not inflater.eof or inflater.unused_data:
            raise WireError(13, "a compressed message cut short or with bytes past its end")
        return plain
