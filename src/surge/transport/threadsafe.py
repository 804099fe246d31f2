"""A framed connection that any thread may send on, without waking the loop to do it.

Asyncio transports are not thread-safe, and handing each frame to the loop with
`call_soon_threadsafe` costs a wake-up of the loop's thread. So this protocol writes
its frames itself, with `send(2)` on a duplicate of the transport's socket, and the
transport only reads. Everything it holds is guarded by `lock` (a router passes its
own, so one lock covers the router and all its links):

* On the loop's thread `send` coalesces as FramedProtocol does: frames collect in `_out`
  and go out in one write at the end of the loop's turn.
* On another thread `send` writes at once, `_out` first, so frames leave in the order
  they were sent.
* What the kernel does not take (its buffer is full) stays in `_out` and the loop
  writes it when the socket turns writable; until then every send only appends, so
  nothing overtakes it. On `close` what is left goes to the transport, which writes it
  before it closes the socket.

A transport without a socket (a pipe, a fake) keeps FramedProtocol's writes, and other
threads hand their frames to the loop.

Reading can be lent too, so that a thread waiting for an answer reads it itself instead
of being woken by the loop: `lend` pauses the transport (on the loop), after which one
thread at a time may `read_until` something it waits for: it polls the duplicate and
feeds what it reads to `data_received`, under the lock, as the loop would. `reclaim`
(on the loop) resumes the transport once no thread is reading. A thread that reads the
end of the stream reclaims, so that the transport sees the connection go.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import threading
from collections.abc import Callable

from surge.transport.connection import FramedProtocol
from surge.transport.messages import Message

__all__ = ["READ_BYTES", "ThreadSafeProtocol"]

READ_BYTES = 256 * 1024  # per read on a lent link, as uvloop reads
# Each reading thread's buffer for them: a fresh `recv(READ_BYTES)` is a buffer above
# malloc's mmap threshold, so every read (one per sync handle call) cost an mmap, an
# mremap to shrink it to what came, and a munmap when it was dropped.
_read_buffers = threading.local()


def _read_buffer() -> memoryview:
    """This thread's buffer for reads on lent links (made at its first)."""
    view: memoryview | None = getattr(_read_buffers, "view", None)
    if view is None:
        view = _read_buffers.view = memoryview(bytearray(READ_BYTES))
    return view


class ThreadSafeProtocol(FramedProtocol):
    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__()  # on the loop's thread: asyncio makes protocols there
        self.lock = lock if lock is not None else threading.RLock()
        self._loop_thread = threading.get_ident()
        self._sock: socket.socket | None = None  # our duplicate, for writing
        self._blocked = False  # the kernel's buffer was full: the loop writes when it drains
        self.lent = False  # the transport is paused: a thread may read (read_until)
        self.reading = False  # a thread is reading now
        self._stop_reading = False  # the loop wants the reading back
        self._wake: int | None = None  # eventfd that wakes a reading thread
        self._poller: select.poll | None = None  # the socket and `_wake`, for that thread
        self._left_to_reader: list[Callable[[], None]] = []  # closes, once it stops polling

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is None:
            return
        try:
            duplicate = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:
            return
        duplicate.setblocking(False)  # it shares the transport's (non-blocking) file
        with self.lock:
            self._sock = duplicate

    def send(self, message: Message) -> None:
        with self.lock:
            if self.is_closed:
                return
            self._encoder.append(self._out, message)
            if threading.get_ident() == self._loop_thread:
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    self._loop.call_soon(self._flush)
            elif self._sock is not None:
                self._write(self._sock)
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self.lock:
            self._flush_scheduled = False
            if self._sock is None:
                super()._flush()
            else:
                self._write(self._sock)

    def _write(self, sock: socket.socket) -> None:
        """Write what `_out` holds, as far as the kernel takes it (lock held)."""
        if self._blocked or not self._out or self.is_closed:
            return
        try:
            sent = sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the peer is gone: the transport reports it (connection_lost)
            self._out.clear()
            self._on_loop(self._abort)
            return
        del self._out[:sent]
        if self._out:
            self._blocked = True
            self._on_loop(self._watch_writable)

    def _on_loop(self, callback: Callable[[], None]) -> None:
        if threading.get_ident() == self._loop_thread:
            callback()
        else:
            self._loop.call_soon_threadsafe(callback)

    def _watch_writable(self) -> None:
        with self.lock:
            if self._blocked and self._sock is not None and not self.is_closed:
                self._loop.add_writer(self._sock.fileno(), self._writable)

    def _writable(self) -> None:
        with self.lock:
            sock = self._sock
            if sock is None:
                return
            self._loop.remove_writer(sock.fileno())
            self._blocked = False
            self._write(sock)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- reading lent to a thread ---------------------------------------------------------

    def lend(self) -> None:
        """Stop the transport's reading, so that a thread may `read_until`."""
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self.lend)
            return
        with self.lock:
            transport = self.transport
            if (self.lent or self._sock is None or transport is None
                    or transport.is_closing()):
                return
            if self._wake is None:
                self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                self._poller = select.poll()
                self._poller.register(self._sock.fileno(), select.POLLIN)
                self._poller.register(self._wake, select.POLLIN)
            transport.pause_reading()
            self.lent = True

    def reclaim(self) -> None:
        """(On the loop.) The transport reads again; a thread reading now is woken, stops,
        and hands the reading back."""
        with self.lock:
            if not self.lent:
                return
            if self.reading:
                self._stop_reading = True
                if self._wake is not None:
                    os.eventfd_write(self._wake, 1)
                return
            self.lent = False
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.resume_reading()

    def read_until(self, done: Callable[[], bool],
                   seconds_left: Callable[[], float | None]) -> None:
        """On a thread other than the loop's: read and handle frames until `done()`, until
        `seconds_left()` reaches 0 (None: no limit), or until the link is no longer lent."""
        while True:
            with self.lock:  # answers are handled under it, by the loop too: ask done() here
                sock, wake, poller = self._sock, self._wake, self._poller
                if (done() or not self.lent or self.reading or sock is None or wake is None
                        or poller is None):
                    self._reader_done()
                    return
                self.reading = True
            left = seconds_left()
            try:
                ready = poller.poll(None if left is None else max(0.0, left) * 1000.0)
            except BaseException:  # Ctrl-C while waiting: the loop may read again
                with self.lock:
                    self.reading = False
                    self._reader_done()
                raise
            with self.lock:
                self.reading = False
                if self._sock is None:
                    self._reader_done()
                    return
                if any(fd == wake for fd, _ in ready):
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(wake)  # reset it, or every poll would return at once
                if self._stop_reading:
                    self._stop_reading = False
                    self._loop.call_soon_threadsafe(self.reclaim)
                    return
                readable = any(fd == sock.fileno() for fd, _ in ready)
                if readable and not self._read_lent():
                    return
            if not ready and left is not None and left <= 0:
                return

    def _reader_done(self) -> None:
        """Close what the link closed while this thread polled it (lock held): no fd is
        closed under a poll, where its number could be reused."""
        for close in self._left_to_reader:
            close()
        self._left_to_reader.clear()

    def _read_lent(self) -> bool:
        """Read what the socket has (lock held); False when nothing more will come."""
        sock = self._sock
        if sock is None or not self.lent:
            return False
        buffer = _read_buffer()
        try:
            count = sock.recv_into(buffer)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            count = 0
        if not count:  # the peer is gone: let the transport see it and report it
            self._loop.call_soon_threadsafe(self.reclaim)
            return False
        self.data_received(bytes(buffer[:count]))  # (a copy: the buffer is read into again)
        return True

    def close(self) -> None:
        if threading.get_ident() != self._loop_thread:  # the transport is the loop's
            self._loop.call_soon_threadsafe(self.close)
            return
        with self.lock:
            transport, sock = self.transport, self._sock
            if transport is None or transport.is_closing():
                return
            if sock is not None:
                self._write(sock)
                if self._out:  # the kernel is full: what is left goes out before the close
                    if self._blocked:
                        self._loop.remove_writer(sock.fileno())
                    transport.write(bytes(self._out))  # (its buffer is empty: we never write there)
                    self._out.clear()
                self._blocked = True  # from now on every send only appends: nothing goes out
            super().close()

    def connection_lost(self, exc: Exception | None) -> None:
        with self.lock:
            sock, self._sock = self._sock, None
            wake, self._wake = self._wake, None
            self._poller = None
            self.lent = False
            closes: list[Callable[[], None]] = []
            if sock is not None:
                if self._blocked:
                    self._loop.remove_writer(sock.fileno())
                try:  # wakes a thread polling it: closing an fd does not
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                closes.append(sock.close)
            if wake is not None:
                os.eventfd_write(wake, 1)
                closes.append(lambda: os.close(wake))
            if self.reading:
                self._left_to_reader.extend(closes)
            else:
                for close in closes:
                    close()
            super().connection_lost(exc)
