"""The server side of an HTTP/2 connection (RFC 9113), sans I/O: what gRPC needs of it.

`H2Connection` takes the client's bytes (`receive`) and tells its `Listener` what they
carried: a stream's headers, its data, its end, its reset. What it sends waits in `out`
for the shell to write: the connection's SETTINGS, acknowledgements, PING answers,
WINDOW_UPDATEs, and the frames of `send_headers`, `send_data` and `reset`.

Flow control, both ways. Receiving: the connection's window is given back as data
arrives (a stream's own window bounds what it holds), a stream's as the listener says it
consumed the bytes (`consumed`), so a stream whose reader is slow stops its sender. Sending:
`send_data` writes what the peer's windows allow and keeps the rest on the stream, in
order, until a WINDOW_UPDATE opens them; trailers (`send_headers(end_stream=True)`)
wait behind that data. When a stream's held data is all written, the listener hears
`drained`.

A connection error (bad preface, a frame the protocol forbids, a bad header block)
sends GOAWAY with its code and raises `H2Error` for the shell to close; a stream error
resets only that stream.
"""

from __future__ import annotations

from collections import deque
from typing import NoReturn, Protocol

from surge.proxy.hpack import Decoder, Header, HpackError

__all__ = ["PREFACE", "H2Connection", "H2Error", "Listener"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 1, 2, 3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 4, 5, 6
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
# What this side allows: a stream may hold 4 MiB unread, frames up to 1 MiB (fewer to
# parse for large messages), the connection 16 MiB in flight.
STREAM_WINDOW = 4 * 1024 * 1024
FRAME_SIZE = 1024 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024


class H2Error(Exception):
    """A connection error: GOAWAY with `code` is in `out`; close after writing it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Listener(Protocol):
    def headers(self, stream_id: int, headers: list[Header], size: int,
                end_stream: bool) -> None: ...
    def data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None: ...
    def reset(self, stream_id: int, code: int) -> None: ...
    def drained(self, stream_id: int) -> None: ...


class _Stream:
    __slots__ = ("held", "held_bytes", "id", "remote_closed", "send_window", "trailers",
                 "unacked")

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.held: deque[bytes | memoryview] = deque()  # what the peer's windows do not take yet
        self.held_bytes = 0
        self.trailers: bytes | None = None  # a header block to end with, after `held`
        self.remote_closed = False
        self.unacked = 0  # bytes consumed and not yet given back in a WINDOW_UPDATE


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((kind, flags))
            + stream_id.to_bytes(4, "big") + payload)


def _settings(*pairs: tuple[int, int]) -> bytes:
    return b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in pairs)


class H2Connection:
    __slots__ = ("_buffer", "_conn_unacked", "_continuing", "_data_end", "_data_left",
                 "_data_stream", "_decoder", "_end_stream",
                 "_header_block", "_initial_window", "_max_header_list", "_preface", "blocked",
                 "goaway_sent", "last_stream_id", "listener", "max_streams", "out",
                 "peer_frame", "send_window", "streams")

    def __init__(self, listener: Listener, max_streams: int = 1024,
                 max_header_list: int = 16 * 1024) -> None:
        self.listener = listener
        self.max_streams = max_streams
        self._max_header_list = max_header_list
        self.streams: dict[int, _Stream] = {}
        self.blocked: dict[int, None] = {}  # streams with held data, oldest first
        self.last_stream_id = 0
        self.send_window = DEFAULT_WINDOW  # the connection's, for what this side sends
        self.peer_frame = DEFAULT_FRAME
        self._initial_window = DEFAULT_WINDOW
        self._decoder = Decoder()
        self._buffer = bytearray()
        self._preface = False
        self._continuing = 0  # the stream whose header block CONTINUATIONs complete
        self._header_block = bytearray()
        self._end_stream = False  # the HEADERS frame being continued ended its stream
        self._data_left = 0  # payload octets of the DATA frame being read still to come
        self._data_stream = 0  # its stream (0: dropped)
        self._data_end = False  # it ends its stream
        self._conn_unacked = 0
        self.goaway_sent = False
        self.out: list[bytes | memoryview] = [frame(SETTINGS, 0, 0, _settings(
            (SETTINGS_MAX_CONCURRENT_STREAMS, max_streams),
            (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (SETTINGS_MAX_FRAME_SIZE, FRAME_SIZE),
            (SETTINGS_MAX_HEADER_LIST_SIZE, max_header_list))),
            frame(WINDOW_UPDATE, 0, 0, (CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big"))]

    @property
    def started(self) -> bool:
        """The client's connection preface is in."""
        return self._preface

    def __repr__(self) -> str:
        return (f"<H2Connection streams={len(self.streams)} blocked={len(self.blocked)} "
                f"last={self.last_stream_id}>")

    # -- receiving -------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Take the client's bytes. Raises H2Error on a connection error.

        A DATA frame's payload goes to the listener as it arrives, in the pieces the
        reads bring (views of them: a large message is copied once, when its reader
        joins it), not once the whole frame is in; other frames wait until whole."""
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        if not self._preface:
            if len(data) < len(PREFACE):
                if not PREFACE.startswith(data):
                    self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._buffer += data
                return
            if not data.startswith(PREFACE):
                self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface = True
            data = data[len(PREFACE):]
        view, pos, size = memoryview(data), 0, len(data)
        try:
            while pos < size:
                if self._data_left:  # the rest of a DATA frame's payload
                    take = min(self._data_left, size - pos)
                    self._data_left -= take
                    self._data_piece(view[pos:pos + take])
                    pos += take
                    continue
                if size - pos < 9:
                    break
                length = int.from_bytes(data[pos:pos + 3], "big")
                if length > FRAME_SIZE:
                    self._fail(FRAME_SIZE_ERROR, f"a frame of {length} octets > {FRAME_SIZE}")
                kind, flags = data[pos + 3], data[pos + 4]
                stream_id = int.from_bytes(data[pos + 5:pos + 9], "big") & MAX_WINDOW
                if kind == DATA and not flags & PADDED:
                    if self._continuing:
                        self._fail(PROTOCOL_ERROR, "a header block was interrupted")
                    pos += 9
                    self._data_begin(flags, stream_id, length)
                    continue
                end = pos + 9 + length
                if end > size:
                    break
                payload = data[pos + 9:end]
                pos = end
                self._frame(kind, flags, stream_id, payload)
        finally:
            if pos < size:
                self._buffer += view[pos:]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing and (kind != CONTINUATION or stream_id != self._continuing):
            self._fail(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:  # a padded one, whole (the others stream: _data_begin)
            self._padded_data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if not self._continuing:
                self._fail(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            self._block(flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                self._fail(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a bad PING")
            if not flags & ACK:
                self.out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if not stream_id or len(payload) != 4:
                self._fail(PROTOCOL_ERROR, "a bad RST_STREAM")
            if self.streams.pop(stream_id, None) is not None:
                self.blocked.pop(stream_id, None)
                self.listener.reset(stream_id, int.from_bytes(payload, "big"))
        elif kind == GOAWAY:
            pass  # the client opens no more streams; those open run to their end
        elif kind == PUSH_PROMISE:
            self._fail(PROTOCOL_ERROR, "a client cannot push")
        elif kind == PRIORITY and (not stream_id or len(payload) != 5):
            self._fail(PROTOCOL_ERROR, "a bad PRIORITY")
        # PRIORITY is advice this server does not take; unknown frame types are ignored.

    def _data_begin(self, flags: int, stream_id: int, length: int) -> None:
        """A DATA frame's header: its payload's pieces follow (`_data_piece`)."""
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "DATA on stream 0")
        self._count_received(length)
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                self._fail(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            stream_id = 0  # in flight when this side ended or reset the stream: dropped
        elif stream.remote_closed:
            self.reset(stream_id, STREAM_CLOSED)
            self.listener.reset(stream_id, STREAM_CLOSED)
            stream_id = 0
        end = bool(flags & END_STREAM)
        if stream is not None and stream_id and end:
            stream.remote_closed = True
        self._data_stream, self._data_end, self._data_left = stream_id, end, length
        if not length and stream_id:
            self.listener.data(stream_id, b"", end)

    def _data_piece(self, piece: memoryview) -> None:
        if self._data_stream:
            self.listener.data(self._data_stream, piece, self._data_end and not self._data_left)

    def _padded_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        data = _unpad(flags, payload)
        if data is None:
            self._fail(PROTOCOL_ERROR, "bad padding")
        self._data_begin(flags, stream_id, len(data))
        self._count_received(len(payload) - len(data))  # padding is consumed at once
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.unacked += len(payload) - len(data)
        self._data_left = 0
        if data and self._data_stream:
            self.listener.data(self._data_stream, data, self._data_end)

    def _count_received(self, size: int) -> None:
        """The connection's window comes back at once (a stream's bounds what it holds)."""
        self._conn_unacked += size
        if self._conn_unacked >= CONNECTION_WINDOW // 2:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, self._conn_unacked.to_bytes(4, "big")))
            self._conn_unacked = 0

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or not stream_id & 1:
            self._fail(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = _unpad(flags, payload) if flags & PADDED else payload
        if block is None:
            self._fail(PROTOCOL_ERROR, "bad padding")
        if flags & PRIORITY_FLAG:
            block = block[5:]
        self._header_block = bytearray(block)
        self._continuing = stream_id
        self._block(flags & ~END_STREAM & 0xFF, stream_id, b"", end_stream=bool(
            flags & END_STREAM))

    def _block(self, flags: int, stream_id: int, payload: bytes,
               end_stream: bool | None = None) -> None:
        block = self._header_block
        block += payload
        if end_stream is not None:
            self._end_stream = end_stream
        if len(block) > 4 * self._max_header_list:
            self._fail(PROTOCOL_ERROR, "a header block far beyond SETTINGS_MAX_HEADER_LIST_SIZE")
        if not flags & END_HEADERS:
            return
        self._continuing = 0
        try:
            headers, size = self._decoder.decode(bytes(block))
        except HpackError as exc:
            self._fail(COMPRESSION_ERROR, str(exc))
        end = self._end_stream
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client end its stream
            if stream.remote_closed or not end:
                self._fail(PROTOCOL_ERROR, f"HEADERS after the end of stream {stream_id}"
                           if stream.remote_closed else "trailers without END_STREAM")
            stream.remote_closed = True
            self.listener.data(stream_id, b"", True)
            return
        if stream_id <= self.last_stream_id:
            return  # trailers in flight when this side ended or reset the stream
        self.last_stream_id = stream_id
        if len(self.streams) >= self.max_streams or self.goaway_sent:
            self.out.append(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        stream = self.streams[stream_id] = _Stream(stream_id, self._initial_window)
        stream.remote_closed = end
        self.listener.headers(stream_id, headers, size, end)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            self._fail(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            self._fail(FRAME_SIZE_ERROR, "a SETTINGS frame of a bad size")
        for at in range(0, len(payload), 6):
            key = int.from_bytes(payload[at:at + 2], "big")
            value = int.from_bytes(payload[at + 2:at + 6], "big")
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    self._fail(FLOW_CONTROL_ERROR, "an initial window past 2^31-1")
                delta, self._initial_window = value - self._initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 16_777_215:
                    self._fail(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self.peer_frame = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                self._fail(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
        self.out.append(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of a bad size")
        increment = int.from_bytes(payload, "big") & MAX_WINDOW
        if not stream_id:
            if not increment:
                self._fail(PROTOCOL_ERROR, "a zero WINDOW_UPDATE")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                self._fail(FLOW_CONTROL_ERROR, "the connection's window past 2^31-1")
            self._flush_blocked()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream that ended: a late update is harmless
        stream.send_window += increment
        if not increment or stream.send_window > MAX_WINDOW:
            self.reset(stream_id, PROTOCOL_ERROR if not increment else FLOW_CONTROL_ERROR)
            self.listener.reset(stream_id, PROTOCOL_ERROR)
            return
        if stream.held:
            self._flush(stream)

    def _fail(self, code: int, message: str) -> NoReturn:
        self.out.append(frame(GOAWAY, 0, 0, self.last_stream_id.to_bytes(4, "big")
                              + code.to_bytes(4, "big") + message.encode()[:256]))
        raise H2Error(code, message)

    # -- flow control of what the client sends ---------------------------------------------

    def consumed(self, stream_id: int, size: int) -> None:
        """The listener is done with `size` bytes of the stream's data: give them back."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.unacked += size
        if stream.unacked >= STREAM_WINDOW // 4:
            self.out.append(frame(WINDOW_UPDATE, 0, stream_id, stream.unacked.to_bytes(4, "big")))
            stream.unacked = 0

    # -- sending ---------------------------------------------------------------------------

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block; with end_stream (trailers) it waits behind held data."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if end_stream and stream.held:
            stream.trailers = block
            return
        self._write_headers(stream_id, block, end_stream)
        if end_stream:
            self._closed_local(stream)

    def _write_headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        limit, out = self.peer_frame, self.out
        flags = END_STREAM if end_stream else 0
        if len(block) <= limit:
            out.append(frame(HEADERS, flags | END_HEADERS, stream_id, block))
            return
        out.append(frame(HEADERS, flags, stream_id, block[:limit]))
        for at in range(limit, len(block), limit):
            last = at + limit >= len(block)
            out.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id,
                             block[at:at + limit]))

    def send_data(self, stream_id: int, data: bytes) -> bool:
        """Send `data` on the stream; True if all of it went out now (else it is held
        until the peer's windows open, and `drained` follows). Large data is framed and
        held as views of itself, never copied."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return True
        if stream.held:
            stream.held.append(data)
            stream.held_bytes += len(data)
            return False
        sent = self._write_data(stream, data)
        if sent == len(data):
            return True
        stream.held.append(memoryview(data)[sent:])
        stream.held_bytes += len(data) - sent
        self.blocked[stream_id] = None
        return False

    def _write_data(self, stream: _Stream, data: bytes | memoryview) -> int:
        """Write what the windows allow of `data`; the number of bytes written."""
        size = len(data)
        allowed = min(size, stream.send_window, self.send_window)
        if allowed <= 0:
            return 0
        stream.send_window -= allowed
        self.send_window -= allowed
        limit, out = self.peer_frame, self.out
        header = frame(DATA, 0, stream.id)[3:]  # kind, flags, stream id
        if allowed == size and size <= limit:
            out.append(size.to_bytes(3, "big") + header)
            out.append(data)
            return size
        view = memoryview(data)
        for at in range(0, allowed, limit):
            chunk = view[at:min(at + limit, allowed)]
            out.append(len(chunk).to_bytes(3, "big") + header)
            out.append(chunk)
        return allowed

    def _flush(self, stream: _Stream) -> None:
        held = stream.held
        while held:
            data = held[0]
            sent = self._write_data(stream, data)
            stream.held_bytes -= sent
            if sent < len(data):
                held[0] = memoryview(data)[sent:]
                self.blocked[stream.id] = None
                return
            held.popleft()
        self.blocked.pop(stream.id, None)
        if stream.trailers is not None:
            self._write_headers(stream.id, stream.trailers, True)
            stream.trailers = None
            self._closed_local(stream)
        self.listener.drained(stream.id)

    def _flush_blocked(self) -> None:
        for stream_id in list(self.blocked):
            if self.send_window <= 0:
                return
            stream = self.streams.get(stream_id)
            if stream is None:
                self.blocked.pop(stream_id, None)
            else:
                self._flush(stream)

    def _closed_local(self, stream: _Stream) -> None:
        """This side ended the stream; a client still sending is told to stop."""
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        if not stream.remote_closed:
            self.out.append(frame(RST_STREAM, 0, stream.id, NO_ERROR.to_bytes(4, "big")))

    def reset(self, stream_id: int, code: int) -> None:
        """End the stream at once (RST_STREAM), dropping what it held."""
        if self.streams.pop(stream_id, None) is not None:
            self.blocked.pop(stream_id, None)
            self.out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def goaway(self) -> None:
        """No new streams (drain): those open run to their end."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self.out.append(frame(GOAWAY, 0, 0, self.last_stream_id.to_bytes(4, "big")
                                  + NO_ERROR.to_bytes(4, "big")))


def _unpad(flags: int, payload: bytes) -> bytes | None:
    if not payload:
        return None
    pad = payload[0]
    if pad >= len(payload):
        return None
    return payload[1:len(payload) - pad]
