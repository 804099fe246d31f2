"""The server side of an HTTP/2 connection (RFC 9113), sans I/O: what gRPC needs of it.

`H2Connection` takes the client's bytes (`receive`) and tells its `Listener` what they
carried: a stream's headers, its data, its end, its reset. What it sends waits in `out`
for the shell to write: the connection's SETTINGS, acknowledgements, PING answers,
WINDOW_UPDATEs, and the frames of `send_headers`, `send_data` and `reset`.

A DATA frame's payload goes to the listener as it arrives, in the pieces the reads
bring (views of them: a large message is copied once, when its reader joins it); other
frames wait until whole, their bytes kept as the reads come and joined once.

Flow control, both ways. Receiving: what the client may send is tracked against the
windows this side advertised (an overrun is a FLOW_CONTROL_ERROR); the connection's
window is given back as data arrives (each stream's bounds what it holds), a stream's
as the listener says it consumed the bytes (`consumed`), so a stream whose reader is
slow stops its sender. Sending: `send_data` writes what the peer's windows allow and
keeps the rest on the stream, in order, until a WINDOW_UPDATE opens them; trailers
(`send_headers(end_stream=True)`) wait behind that data. When a stream's held data is
all written, the listener hears `drained`.

What is sent is the sending half's (codecs/h2_send.py, which this class extends); the
frames' vocabulary is codecs/h2_frames.py.

A connection error (bad preface, a frame the protocol forbids, a bad header block, a
flood of cheap frames) sends GOAWAY with its code and raises `H2Error` for the shell to
close; a stream error resets only that stream. A new stream's header list is checked
first (codecs/h2_fields.py, RFC 9113 8.2-8.3): a malformed request is reset PROTOCOL_ERROR
and the listener never hears of it. How the latest streams closed is remembered
(h2_send.py), so a frame on a closed stream is told apart: in flight when this side reset
it (ignored), or sent after the client ended or reset it (STREAM_CLOSED).

(A little over 500 lines: the receiving half of one state machine, read top to bottom.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn

from surge.codecs.h2_fields import content_length, request_problem, trailers_problem
from surge.codecs.h2_frames import (
    ACK,
    COMPRESSION_ERROR,
    CONNECTION_WINDOW,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    STREAM_CLOSED,
    STREAM_WINDOW,
    WINDOW_UPDATE,
    FloodGuard,
    H2Error,
    frame,
    settings,
    unpad,
)
from surge.codecs.h2_send import ENDED, RESET_HERE, RESET_THERE, H2Sender, Listener, Stream
from surge.codecs.hpack import TABLE_SIZE, Decoder, Header, HpackError

__all__ = ["H2Connection", "H2Error", "Listener"]


class H2Connection(H2Sender):
    __slots__ = ("_conn_unacked", "_continuing", "_data_end", "_data_left", "_data_stream",
                 "_decoder", "_end_stream", "_flood", "_header_block", "_initial_window",
                 "_max_header_list", "_need", "_pending", "_pending_size", "_preface",
                 "_recv_window", "_self_dependent", "max_streams", "refused")

    def __init__(self, listener: Listener, max_streams: int = 1024,
                 max_header_list: int = 16 * 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(listener)
        self.max_streams = max_streams
        self._max_header_list = max_header_list
        self._initial_window = DEFAULT_WINDOW
        self._recv_window = CONNECTION_WINDOW  # what the client may still send, in all
        self._conn_unacked = 0
        self._decoder = Decoder()
        self._flood = FloodGuard(clock)
        self._pending: list[bytes] = []  # bytes of a frame not yet whole
        self._pending_size = 0
        self._need = 0  # how many pending bytes make the next step possible
        self._preface = False
        self._continuing = 0  # the stream whose header block CONTINUATIONs complete
        self._header_block = bytearray()
        self._end_stream = False  # the HEADERS frame being continued ended its stream
        self._self_dependent = False  # its priority named its own stream
        self.refused = ""  # why the last malformed request was refused (for the logs)
        self._data_left = 0  # payload octets of the DATA frame being read still to come
        self._data_stream = 0  # its stream (0: dropped)
        self._data_end = False  # it ends its stream
        self.out.append(frame(SETTINGS, 0, 0, settings(
            (SETTINGS_MAX_CONCURRENT_STREAMS, max_streams),
            (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (SETTINGS_MAX_FRAME_SIZE, FRAME_SIZE),
            (SETTINGS_MAX_HEADER_LIST_SIZE, max_header_list))))
        self.out.append(frame(WINDOW_UPDATE, 0, 0,
                              (CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big")))

    @property
    def started(self) -> bool:
        """The client's connection preface is in."""
        return self._preface

    def __repr__(self) -> str:
        return (f"<H2Connection streams={len(self.streams)} blocked={len(self.blocked)} "
                f"last={self.last_stream_id}>")

    def close(self) -> None:
        """The connection is gone: drop what it held."""
        self.streams.clear()
        self.blocked.clear()
        self.out.clear()
        self._pending.clear()

    # -- receiving -------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Take the client's bytes. Raises H2Error on a connection error."""
        if self._pending:
            self._pending.append(data)
            self._pending_size += len(data)
            if self._pending_size < self._need:
                return
            data = b"".join(self._pending)
            self._pending.clear()
        if not self._preface:
            if len(data) < len(PREFACE):
                if not PREFACE.startswith(data):
                    self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._keep(data, len(PREFACE))
                return
            if not data.startswith(PREFACE):
                self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface = True
            data = data[len(PREFACE):]
        view, pos, size = memoryview(data), 0, len(data)
        need = 0
        try:
            while pos < size:
                if self._data_left:  # the rest of a DATA frame's payload
                    take = min(self._data_left, size - pos)
                    self._data_left -= take
                    self._data_piece(view[pos:pos + take])
                    pos += take
                    continue
                if size - pos < 9:
                    need = 9
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
                    need = 9 + length
                    break
                payload = data[pos + 9:end]
                pos = end
                self._frame(kind, flags, stream_id, payload)
        finally:
            if pos < size:
                self._keep(bytes(view[pos:]), need)

    def _keep(self, rest: bytes, need: int) -> None:
        self._pending = [rest]
        self._pending_size = len(rest)
        self._need = need

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
            if not payload and not flags & END_HEADERS:
                self._cheap("empty CONTINUATION")
            self._block(flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                self._fail(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a bad PING")
            if not flags & ACK:
                self._cheap("PING")
                self.out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == GOAWAY:
            if stream_id:
                self._fail(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                self._fail(FRAME_SIZE_ERROR, "a GOAWAY shorter than 8 octets")
            # The client opens no more streams; those open run to their end.
        elif kind == PUSH_PROMISE:
            self._fail(PROTOCOL_ERROR, "a client cannot push")
        elif kind == PRIORITY:
            self._priority(stream_id, payload)
        # Unknown frame types are ignored.

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if stream_id > self.last_stream_id:
            self._fail(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "an RST_STREAM of a bad size")
        self._cheap("RST_STREAM")
        if self.streams.pop(stream_id, None) is not None:
            self.blocked.pop(stream_id, None)
            self.remember(stream_id, RESET_THERE)
            self.listener.reset(stream_id, int.from_bytes(payload, "big"))

    def _priority(self, stream_id: int, payload: bytes) -> None:
        """Advice this server does not take; checked all the same (RFC 9113 5.3.1, 6.3)."""
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "PRIORITY on stream 0")
        code = (FRAME_SIZE_ERROR if len(payload) != 5 else PROTOCOL_ERROR
                if int.from_bytes(payload[:4], "big") & MAX_WINDOW == stream_id else 0)
        if not code:
            return
        if stream_id > self.last_stream_id:  # no RST_STREAM may name an idle stream
            self._fail(code, f"a bad PRIORITY on idle stream {stream_id}")
        self._cheap("bad PRIORITY")
        if stream_id in self.streams:
            self._stream_error(stream_id, code)
        else:  # closed: how it closed still decides what later frames on it get
            self.out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def _cheap(self, what: str) -> None:
        if not self._flood.spend():
            self._fail(ENHANCE_YOUR_CALM, f"a flood of {what} frames")

    def _data_begin(self, flags: int, stream_id: int, length: int) -> None:
        """A DATA frame's header: its payload's pieces follow (`_data_piece`)."""
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "DATA on stream 0")
        end = bool(flags & END_STREAM)
        if not length and not end:
            self._cheap("empty DATA")
        self._received(length)
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                self._fail(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if self.closed.get(stream_id) != RESET_HERE:  # else in flight when reset here
                self._cheap("DATA on a closed stream")
                self.out.append(frame(RST_STREAM, 0, stream_id,
                                      STREAM_CLOSED.to_bytes(4, "big")))
            stream_id = 0  # dropped
        elif stream.remote_closed:
            self._stream_error(stream_id, STREAM_CLOSED)
            stream_id = 0
        else:
            stream.recv_window -= length
            over = False
            if stream.expect >= 0:
                stream.expect -= length
                over = stream.expect < 0
            if stream.recv_window < 0:  # the client ignored the stream's window
                self._stream_error(stream_id, FLOW_CONTROL_ERROR)
                stream_id = 0
            elif over or (end and stream.expect > 0):
                self._stream_error(stream_id, PROTOCOL_ERROR)  # not its content-length
                stream_id = 0
            elif end:
                stream.remote_closed = True
        self._data_stream, self._data_end, self._data_left = stream_id, end, length
        if not length and stream_id:
            self.listener.data(stream_id, b"", end)

    def _data_piece(self, piece: memoryview) -> None:
        if self._data_stream:
            self.listener.data(self._data_stream, piece, self._data_end and not self._data_left)

    def _padded_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        data = unpad(payload)
        if data is None:
            self._fail(PROTOCOL_ERROR, "bad padding")
        padding = len(payload) - len(data)
        self._data_begin(flags, stream_id, len(data))
        self._received(padding)
        self._data_left = 0
        stream = self.streams.get(stream_id) if self._data_stream else None
        if stream is not None:
            stream.recv_window -= padding
            if stream.recv_window < 0:
                self._stream_error(stream_id, FLOW_CONTROL_ERROR)
                return
            self.consumed(stream_id, padding)  # padding is consumed at once
        if data and self._data_stream:
            self.listener.data(self._data_stream, data, self._data_end)

    def _received(self, size: int) -> None:
        """Count DATA against the connection's window, given back at once (each stream's
        own window bounds what it holds)."""
        self._recv_window -= size
        if self._recv_window < 0:
            self._fail(FLOW_CONTROL_ERROR, "the client ignored the connection's window")
        self._conn_unacked += size
        if self._conn_unacked >= CONNECTION_WINDOW // 2:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, self._conn_unacked.to_bytes(4, "big")))
            self._recv_window += self._conn_unacked
            self._conn_unacked = 0

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or not stream_id & 1:
            self._fail(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = unpad(payload) if flags & PADDED else payload
        if block is None:
            self._fail(PROTOCOL_ERROR, "bad padding")
        self._self_dependent = False
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                self._fail(PROTOCOL_ERROR, "a HEADERS priority field past its frame")
            self._self_dependent = int.from_bytes(block[:4], "big") & MAX_WINDOW == stream_id
            block = block[5:]
        self._header_block = bytearray(block)
        self._continuing = stream_id
        self._end_stream = bool(flags & END_STREAM)
        self._block(flags, stream_id, b"")

    def _block(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = self._header_block
        block += payload
        if len(block) > 4 * self._max_header_list:
            self._fail(PROTOCOL_ERROR, "a header block far beyond SETTINGS_MAX_HEADER_LIST_SIZE")
        if not flags & END_HEADERS:
            return
        self._continuing = 0
        self._header_block = bytearray()
        try:
            headers, size = self._decoder.decode(bytes(block), self._max_header_list)
        except HpackError as exc:
            self._fail(COMPRESSION_ERROR, str(exc))
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._trailers(stream, headers)
        elif stream_id <= self.last_stream_id:
            self._headers_on_closed(stream_id)
        else:
            self._request(stream_id, headers, size)

    def _request(self, stream_id: int, headers: list[Header], size: int) -> None:
        """A new stream's header block: a request, unless malformed (RFC 9113 8.1.1)."""
        end = self._end_stream
        self.last_stream_id = stream_id
        if len(self.streams) >= self.max_streams or self.goaway_sent:
            self.refuse(stream_id, REFUSED_STREAM)
            return
        expect = content_length(headers) if size <= self._max_header_list else None
        problem = (request_problem(headers) if size <= self._max_header_list else None) or (
            "a stream that depends on itself" if self._self_dependent else None) or (
            "content-length past the stream's end" if end and expect else None)
        if problem is not None:
            self.refused = problem
            self.refuse(stream_id, PROTOCOL_ERROR)
            return
        stream = self.streams[stream_id] = Stream(stream_id, self._initial_window)
        stream.remote_closed = end
        stream.expect = -1 if expect is None else expect
        self.listener.headers(stream_id, headers, size, end)

    def _trailers(self, stream: Stream, headers: list[Header]) -> None:
        """A second header block on an open stream: trailers, which must end it."""
        if stream.remote_closed:
            self._stream_error(stream.id, STREAM_CLOSED)
        elif not self._end_stream or stream.expect > 0 or trailers_problem(headers):
            self._stream_error(stream.id, PROTOCOL_ERROR)
        else:
            stream.remote_closed = True
            self.listener.data(stream.id, b"", True)

    def _headers_on_closed(self, stream_id: int) -> None:
        how = self.closed.get(stream_id)
        if how == RESET_HERE:
            return  # trailers in flight when this side ended or reset the stream
        if how == RESET_THERE or (how is None and stream_id <= self.forgotten):
            self._cheap("HEADERS on a closed stream")
            self.out.append(frame(RST_STREAM, 0, stream_id, STREAM_CLOSED.to_bytes(4, "big")))
            return
        if how == ENDED:
            self._fail(STREAM_CLOSED, f"HEADERS on stream {stream_id}, which the client ended")
        # Above every stream forgotten and in neither table: never opened (RFC 9113 5.1.1).
        self._fail(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, below the last one opened "
                                   f"({self.last_stream_id})")

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            self._fail(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                self._fail(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        self._cheap("SETTINGS")
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
                    if stream.send_window > MAX_WINDOW:
                        self._fail(FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 16_777_215:
                    self._fail(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self.peer_frame = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                self._fail(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            elif key == SETTINGS_HEADER_TABLE_SIZE and value < TABLE_SIZE:
                # This side's blocks never index, but a peer that lowers the table
                # expects a size update at the start of the next one (RFC 7541 4.2).
                self.table_update = b"\x20"
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
        if stream_id > self.last_stream_id:
            self._fail(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream that ended: a late update is harmless
        stream.send_window += increment
        if not increment or stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, PROTOCOL_ERROR if not increment else
                               FLOW_CONTROL_ERROR)
            return
        if stream.held:
            self._flush(stream)

    def _stream_error(self, stream_id: int, code: int) -> None:
        self.reset(stream_id, code)
        self.listener.reset(stream_id, code)

    def _fail(self, code: int, message: str) -> NoReturn:
        self.out.append(frame(GOAWAY, 0, 0, self.last_stream_id.to_bytes(4, "big")
                              + code.to_bytes(4, "big") + message.encode()[:256]))
        raise H2Error(code, message)

    # -- flow control of what the client sends ---------------------------------------------

    def consumed(self, stream_id: int, size: int) -> None:
        """The listener is done with `size` bytes of the stream's data: give them back."""
        stream = self.streams.get(stream_id)
        owed = 0 if stream is None else stream.consumed(size)
        if owed and stream is not None:
            self.out.append(frame(WINDOW_UPDATE, 0, stream_id, owed.to_bytes(4, "big")))
            stream.recv_window += owed
