"""A WebSocket's protocol side in the proxy, sans I/O: client frames in, whole messages out.

After the 101 the proxy speaks RFC 6455 with the client and whole messages with the
replica (`WsData`, `WsClose`), so the replica never parses frames and the proxy can
enforce the limits itself. Incoming frames are parsed by wsproto's frame layer (masking,
fragments, control frames, UTF-8 checks; no extensions are negotiated). Outgoing frames
are the server's, unmasked, and cheap enough to build here (`frame`).

`WsSession.receive(data, now)` returns what the client said: a `WsData` per finished
message, a `WsClose` when it closed (or broke a rule: a message over `max_message_bytes`
ends with 1009, a protocol error with wsproto's 1002/1007), and leaves in `out` the
bytes owed to the client (pongs, the close reply). `last_active` is when anything last
moved either way: the idle limit reads it.

wsproto (and h11 under it) is imported with the first WebSocket, not with the proxy:
they are 40 ms of every proxy's start otherwise.
"""

from __future__ import annotations

import struct

from surge.transport.messages import WsClose, WsData

__all__ = ["MESSAGE_TOO_BIG", "WsSession", "accept_head", "close_frame", "frame",
           "is_websocket_upgrade"]

TEXT, BINARY, CLOSE, PONG = 0x1, 0x2, 0x8, 0xA
NORMAL, GOING_AWAY, INTERNAL_ERROR, MESSAGE_TOO_BIG = 1000, 1001, 1011, 1009
# Codes that name a state and may never travel in a close frame (RFC 6455 7.4.1).
_UNSENDABLE = frozenset({1005, 1006, 1015})
_HOP = frozenset({b"upgrade", b"connection", b"sec-websocket-accept",
                  b"sec-websocket-protocol", b"content-length", b"transfer-encoding"})


def is_websocket_upgrade(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The Sec-WebSocket-Key of a well-formed version-13 WebSocket upgrade, else None."""
    upgrade = key = version = b""
    for name, value in headers:
        if name == b"upgrade":
            upgrade = value
        elif name == b"sec-websocket-key":
            key = value
        elif name == b"sec-websocket-version":
            version = value
    if b"websocket" not in upgrade.lower() or not key or version.strip() != b"13":
        return None
    return key.strip()


def accept_head(key: bytes, subprotocol: str | None, headers: list[tuple[bytes, bytes]],
                request_id: bytes) -> bytes:
    """The 101 that completes the handshake, with the app's extra headers."""
    from wsproto.utilities import generate_accept_token

    lines = [b"HTTP/1.1 101 Switching Protocols", b"upgrade: websocket",
             b"connection: Upgrade", b"sec-websocket-accept: " + generate_accept_token(key),
             b"x-request-id: " + request_id]
    if subprotocol:
        lines.append(b"sec-websocket-protocol: " + subprotocol.encode())
    lines.extend(name + b": " + value for name, value in headers
                 if name.lower() not in _HOP and name.lower() != b"x-request-id")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def frame(opcode: int, payload: bytes) -> bytes:
    """One final, unmasked frame (the server's side)."""
    size = len(payload)
    if size < 126:
        return bytes((0x80 | opcode, size)) + payload
    if size < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, size) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, size) + payload


def close_frame(code: int, reason: str = "") -> bytes:
    if code in _UNSENDABLE:
        return frame(CLOSE, b"")
    return frame(CLOSE, struct.pack("!H", code) + reason.encode()[:123])


class WsSession:
    """One client's frames, parsed; its limits kept."""

    __slots__ = ("_parser", "_parts", "_size", "closed", "key", "last_active", "max_message",
                 "out")

    def __init__(self, key: bytes, max_message: int, now: float) -> None:
        self.key = key
        self.max_message = max_message
        self.last_active = now
        from wsproto.connection import Connection, ConnectionType

        self._parser = Connection(ConnectionType.SERVER)
        self._parts: list[bytes] = []  # the message being received, fragment by fragment
        self._size = 0
        self.closed = False  # a close went to the client (or came from it)
        self.out = bytearray()  # bytes owed to the client: pongs, close frames

    def __repr__(self) -> str:
        return (f"<WsSession closed={self.closed} partial={self._size} "
                f"last_active={self.last_active:.3f}>")

    def receive(self, data: bytes, now: float) -> list[WsData | WsClose]:
        if self.closed:
            return []
        from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

        self.last_active = now
        parser = self._parser
        parser.receive_data(data)
        said: list[WsData | WsClose] = []
        for event in parser.events():
            if isinstance(event, TextMessage | BytesMessage):
                text = isinstance(event, TextMessage)
                payload = event.data
                part = payload.encode() if isinstance(payload, str) else bytes(payload)
                self._size += len(part)
                if self._size > self.max_message:
                    said.append(self.close(MESSAGE_TOO_BIG, "message too big"))
                    return said
                self._parts.append(part)
                if event.message_finished:
                    parts = self._parts
                    body = parts[0] if len(parts) == 1 else b"".join(parts)
                    self._parts, self._size = [], 0
                    said.append(WsData(id=0, data=body, text=text))
            elif isinstance(event, Ping):
                self.out += frame(PONG, bytes(event.payload))
            elif isinstance(event, CloseConnection):
                said.append(self.close(int(event.code), event.reason or ""))
                return said
        return said

    def close(self, code: int, reason: str = "") -> WsClose:
        """Close toward the client (a reply to its close, or ours); what the app hears."""
        if not self.closed:
            self.closed = True
            self.out += close_frame(code, reason)
        return WsClose(id=0, code=code, reason=reason)

    def take_out(self) -> bytes:
        out = bytes(self.out)
        self.out.clear()
        return out
