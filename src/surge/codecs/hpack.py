"""HPACK (RFC 7541) for the gRPC ingress's HTTP/2: a decoder with its dynamic table, and
the literal encoding of the few headers the proxy sends.

The proxy never adds to the client's dynamic table (every header it sends is a literal
"without indexing"), so it needs no encoder state and ignores the table size a client
allows it. Decoding keeps the table the client's encoder maintains, up to the size this
side advertises (4,096 octets, HTTP/2's default), and caches the strings it decoded from
Huffman when they are short (a client sends the same values again and again: every new
one costs a table walk).
"""

from __future__ import annotations

from collections import deque

from surge.codecs.huffman import HuffmanError
from surge.codecs.huffman import decode as huffman_decode

__all__ = ["Decoder", "HpackError", "integer", "literal"]

Header = tuple[bytes, bytes]

STATIC: tuple[Header, ...] = (
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"),
    (b":path", b"/index.html"), (b":scheme", b"http"), (b":scheme", b"https"),
    (b":status", b"200"), (b":status", b"204"), (b":status", b"206"), (b":status", b"304"),
    (b":status", b"400"), (b":status", b"404"), (b":status", b"500"),
    (b"accept-charset", b""), (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""), (b"accept-ranges", b""), (b"accept", b""),
    (b"access-control-allow-origin", b""), (b"age", b""), (b"allow", b""),
    (b"authorization", b""), (b"cache-control", b""), (b"content-disposition", b""),
    (b"content-encoding", b""), (b"content-language", b""), (b"content-length", b""),
    (b"content-location", b""), (b"content-range", b""), (b"content-type", b""),
    (b"cookie", b""), (b"date", b""), (b"etag", b""), (b"expect", b""), (b"expires", b""),
    (b"from", b""), (b"host", b""), (b"if-match", b""), (b"if-modified-since", b""),
    (b"if-none-match", b""), (b"if-range", b""), (b"if-unmodified-since", b""),
    (b"last-modified", b""), (b"link", b""), (b"location", b""), (b"max-forwards", b""),
    (b"proxy-authenticate", b""), (b"proxy-authorization", b""), (b"range", b""),
    (b"referer", b""), (b"refresh", b""), (b"retry-after", b""), (b"server", b""),
    (b"set-cookie", b""), (b"strict-transport-security", b""), (b"transfer-encoding", b""),
    (b"user-agent", b""), (b"vary", b""), (b"via", b""), (b"www-authenticate", b""),
)
ENTRY_OVERHEAD = 32  # octets an entry counts beyond its name and value (RFC 7541 4.1)
TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE: what this side advertises (the default)
_CACHE_LIMIT = 512  # Huffman-decoded strings kept per connection, each of at most
_CACHED_LENGTH = 128  # this many octets (the values a client repeats are short)


class HpackError(ValueError):
    """A header block that cannot be decoded: a COMPRESSION_ERROR of the connection."""


class Decoder:
    __slots__ = ("_cache", "_max_size", "_size", "_table")

    def __init__(self) -> None:
        self._table: deque[Header] = deque()  # newest first: index 62 is [0]
        self._size = 0
        self._max_size = TABLE_SIZE
        self._cache: dict[bytes, bytes] = {}

    def __repr__(self) -> str:
        return f"<hpack.Decoder entries={len(self._table)} size={self._size}>"

    def decode(self, block: bytes, limit: int) -> tuple[list[Header], int]:
        """The headers of a block, and the list's size as HTTP/2 counts it (names, values
        and 32 octets each: SETTINGS_MAX_HEADER_LIST_SIZE's measure). Past `limit` the
        block is still decoded (the table must follow the client's encoder) but its
        headers are not kept: a small block of references to one large entry must not
        become a large list (the size says it is too large)."""
        headers: list[Header] = []
        size, pos, end = 0, 0, len(block)
        try:
            while pos < end:
                first = block[pos]
                if first & 0x80:  # indexed field
                    index, pos = _integer(block, pos, 7)
                    header = self._get(index)
                elif first & 0x40:  # literal with incremental indexing
                    header, pos = self._literal(block, pos, 6)
                    self._add(header)
                elif first & 0x20:  # dynamic table size update
                    if size:
                        raise HpackError("a table size update after the block's first field")
                    new_size, pos = _integer(block, pos, 5)
                    if new_size > TABLE_SIZE:
                        raise HpackError(f"a table size update to {new_size} > {TABLE_SIZE}")
                    self._max_size = new_size
                    self._evict()
                    continue
                else:  # literal without indexing / never indexed
                    header, pos = self._literal(block, pos, 4)
                size += len(header[0]) + len(header[1]) + ENTRY_OVERHEAD
                if size <= limit:
                    headers.append(header)
        except IndexError:
            raise HpackError("a header block ends inside a field") from None
        return headers, size

    def _get(self, index: int) -> Header:
        if 0 < index <= len(STATIC):
            return STATIC[index - 1]
        dynamic = index - len(STATIC) - 1
        if 0 <= dynamic < len(self._table):
            return self._table[dynamic]
        raise HpackError(f"header index {index} is not in the table")

    def _literal(self, block: bytes, pos: int, prefix: int) -> tuple[Header, int]:
        index, pos = _integer(block, pos, prefix)
        if index:
            name = self._get(index)[0]
        else:
            name, pos = self._string(block, pos)
        value, pos = self._string(block, pos)
        return (name, value), pos

    def _string(self, block: bytes, pos: int) -> tuple[bytes, int]:
        huffman = block[pos] & 0x80
        length, pos = _integer(block, pos, 7)
        end = pos + length
        if end > len(block):
            raise HpackError("a header string runs past its block")
        raw = block[pos:end]
        if not huffman:
            return raw, end
        decoded = self._cache.get(raw)
        if decoded is None:
            try:
                decoded = huffman_decode(raw)
            except HuffmanError as exc:
                raise HpackError(str(exc)) from None
            if length <= _CACHED_LENGTH:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[raw] = decoded
        return decoded, end

    def _add(self, header: Header) -> None:
        self._table.appendleft(header)
        self._size += len(header[0]) + len(header[1]) + ENTRY_OVERHEAD
        self._evict()

    def _evict(self) -> None:
        table = self._table
        while self._size > self._max_size and table:
            name, value = table.pop()
            self._size -= len(name) + len(value) + ENTRY_OVERHEAD


def _integer(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer with a `prefix`-bit prefix at `pos`, and the position after it."""
    mask = (1 << prefix) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        octet = block[pos]
        pos += 1
        value += (octet & 0x7F) << shift
        if not octet & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise HpackError("an HPACK integer is too large")


def integer(value: int, prefix: int, first: int = 0) -> bytes:
    """`value` as an HPACK integer with a `prefix`-bit prefix, `first` in the high bits."""
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes((first | value,))
    out = bytearray((first | mask,))
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field "literal without indexing, new name", neither string Huffman-coded."""
    return b"\x00" + integer(len(name), 7) + name + integer(len(value), 7) + value
