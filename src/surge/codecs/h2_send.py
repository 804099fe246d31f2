"""The sending half of a server's HTTP/2 connection (codecs/h2.py is the whole): header
blocks, data framed to the peer's frame size and held, per stream and in order, until
the peer's windows take it (at most MAX_HELD_BYTES past one message), trailers behind
the data, resets and GOAWAY, and how the latest streams closed. Everything written waits
in `out` for the shell."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Protocol

from surge.codecs.h2_frames import (
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    RST_STREAM,
    STREAM_WINDOW,
    frame,
)
from surge.codecs.hpack import Header

__all__ = ["ENDED", "RESET_HERE", "RESET_THERE", "BaseStream", "H2Sender", "Held",
           "HeldLimitError", "Listener", "Stream", "sent_or_held"]

class Listener(Protocol):
    """What the connection tells its user (codecs/h2.py receives, this half drains)."""

    def headers(self, stream_id: int, headers: list[Header], size: int,
                end_stream: bool) -> None: ...
    def data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None: ...
    def reset(self, stream_id: int, code: int) -> None: ...
    def drained(self, stream_id: int) -> None: ...


# How a stream closed, remembered for the frames that may still come on it (RFC 9113
# 5.1): those in flight when this side reset it are ignored; anything after the client
# ended or reset it is an error of type STREAM_CLOSED.
RESET_HERE, ENDED, RESET_THERE = 0, 1, 2
# Closed streams remembered so, the most recent ones (a busy connection keeps ~10 KiB of
# them): a frame on one forgotten since is STREAM_CLOSED, whatever closed it.
CLOSED_KEPT = 128
# Bytes a stream may hold for its client beyond the message being sent: a routed call's
# answers are bounded by their replica's credit (transport/flow.py, 512 KiB), so only a
# stream answered here (reflection) can reach it, by a client that sends and never reads.
MAX_HELD_BYTES = 4 * 1024 * 1024


class HeldLimitError(Exception):
    """A stream already holds `held` bytes its client has not taken (limit `limit`):
    nothing more is sent on it."""

    def __init__(self, stream_id: int, held: int, limit: int) -> None:
        super().__init__(f"stream {stream_id} holds {held} bytes its client has not read "
                         f"(the limit is {limit})")
        self.stream_id, self.held, self.limit = stream_id, held, limit


class Held:
    """What a stream's windows refuse yet, in order: views of the data, never copies."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: deque[bytes | memoryview] = deque()
        self.size = 0

    def __bool__(self) -> bool:
        return bool(self.chunks)

    def add(self, stream_id: int, data: bytes | memoryview) -> None:
        """Hold `data` behind what is held; HeldLimitError past MAX_HELD_BYTES."""
        if self.size >= MAX_HELD_BYTES:
            raise HeldLimitError(stream_id, self.size, MAX_HELD_BYTES)
        self.chunks.append(data)
        self.size += len(data)

    def behind(self, stream_id: int, data: bytes | memoryview) -> bool:
        """Hold `data` if anything is held already (it must go after that); True if so."""
        if not self.chunks:
            return False
        self.add(stream_id, data)
        return True

    def rest(self, data: bytes | memoryview, sent: int) -> None:
        """Hold what was not sent of a message: it may exceed the limit once."""
        self.chunks.append(memoryview(data)[sent:])
        self.size += len(data) - sent

    def drain(self, write: Callable[[bytes | memoryview], int]) -> bool:
        """Write what is held, in order, while `write` takes it all; True when empty."""
        chunks = self.chunks
        while chunks:
            data = chunks[0]
            sent = write(data)
            self.size -= sent
            if sent < len(data):
                chunks[0] = memoryview(data)[sent:]
                return False
            chunks.popleft()
        return True


class BaseStream:
    """What every server stream keeps (this stack's and bench/h2_hyper.py's): its held
    data and the client's credit owed back."""

    __slots__ = ("held", "remote_closed", "unacked")

    def __init__(self, remote_closed: bool) -> None:
        self.held = Held()
        self.remote_closed = remote_closed
        self.unacked = 0  # bytes consumed and not yet given back in a WINDOW_UPDATE

    def consumed(self, size: int) -> int:
        """`size` bytes of the client's data were read: the credit to give back now (a
        quarter window's worth at least, so updates stay few), else 0."""
        if self.remote_closed or size <= 0:
            return 0
        self.unacked += size
        if self.unacked < STREAM_WINDOW // 4:
            return 0
        owed, self.unacked = self.unacked, 0
        return owed


def sent_or_held(stream_id: int, stream: BaseStream, data: bytes | memoryview, sent: int,
                 blocked: dict[int, None]) -> bool:
    """True if all of `data` went out; else its rest is held and the stream waits in
    `blocked` for the peer's windows."""
    if sent == len(data):
        return True
    stream.held.rest(data, sent)
    blocked[stream_id] = None
    return False


class Stream(BaseStream):
    __slots__ = ("expect", "id", "recv_window", "send_window", "trailers")

    def __init__(self, stream_id: int, send_window: int) -> None:
        super().__init__(False)
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW  # what the client may still send on it
        self.expect = -1  # DATA octets its content-length still announces (-1: none)
        self.trailers: bytes | None = None  # a header block to end with, after `held`


class H2Sender:
    """What a connection sends. Its receiving half (H2Connection) opens the streams."""

    __slots__ = ("blocked", "closed", "forgotten", "goaway_sent", "last_stream_id", "listener",
                 "out", "peer_frame", "send_window", "streams", "table_update")

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.streams: dict[int, Stream] = {}
        self.closed: dict[int, int] = {}  # the last CLOSED_KEPT streams closed: how
        self.forgotten = 0  # the highest stream id no longer in `closed`
        self.blocked: dict[int, None] = {}  # streams with held data, oldest first
        self.last_stream_id = 0
        self.send_window = DEFAULT_WINDOW  # the connection's, for what this side sends
        self.peer_frame = DEFAULT_FRAME
        self.goaway_sent = False
        self.table_update = b""  # a table size update owed at the next block sent
        self.out: list[bytes | memoryview] = []

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
        if self.table_update:
            block, self.table_update = self.table_update + block, b""
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
        held as views of itself, never copied. Raises HeldLimitError when the stream
        already holds MAX_HELD_BYTES."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return True
        if stream.held.behind(stream_id, data):
            return False
        return sent_or_held(stream_id, stream, data, self._write_data(stream, data),
                            self.blocked)

    def _write_data(self, stream: Stream, data: bytes | memoryview) -> int:
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

    def _flush(self, stream: Stream) -> None:
        if not stream.held.drain(partial(self._write_data, stream)):
            self.blocked.pop(stream.id, None)  # to the back: the others go first
            self.blocked[stream.id] = None
            return
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

    def _closed_local(self, stream: Stream) -> None:
        """This side ended the stream; a client still sending is told to stop."""
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        if stream.remote_closed:
            self.remember(stream.id, ENDED)
        else:
            self.out.append(frame(RST_STREAM, 0, stream.id, NO_ERROR.to_bytes(4, "big")))
            self.remember(stream.id, RESET_HERE)

    def reset(self, stream_id: int, code: int) -> None:
        """End the stream at once (RST_STREAM), dropping what it held."""
        if self.streams.pop(stream_id, None) is not None:
            self.blocked.pop(stream_id, None)
            self.refuse(stream_id, code)

    def refuse(self, stream_id: int, code: int) -> None:
        """RST_STREAM for a stream this side holds no state of (any more)."""
        self.out.append(frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))
        self.remember(stream_id, RESET_HERE)

    def remember(self, stream_id: int, how: int) -> None:
        closed = self.closed
        closed[stream_id] = how
        if len(closed) > CLOSED_KEPT:
            oldest = next(iter(closed))
            del closed[oldest]
            self.forgotten = max(self.forgotten, oldest)

    def goaway(self) -> None:
        """No new streams (drain): those open run to their end."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self.out.append(frame(GOAWAY, 0, 0, self.last_stream_id.to_bytes(4, "big")
                                  + NO_ERROR.to_bytes(4, "big")))

    def busy(self) -> bool:
        """Streams are open or data is held (draining waits for them)."""
        return bool(self.streams or self.blocked)
