"""A framed connection as an asyncio Protocol, with write coalescing.

Subclasses implement `message_received` and `closed`. `send` appends the encoded
frame to an output buffer flushed once per event-loop turn, so a burst of responses
becomes one write.
"""

from __future__ import annotations

import asyncio
import logging

from surge.transport.framing import MAX_FRAME_BYTES, FrameDecoder, FrameEncoder
from surge.transport.gate import HandshakeGate
from surge.transport.messages import Message

__all__ = ["FramedProtocol"]

log = logging.getLogger("surge.transport")


# Before a peer presents its token: frames this small, and this long to present it.
PREAUTH_MAX_FRAME = 64 * 1024
PREAUTH_TIMEOUT_S = 10.0


class FramedProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder()
        self._encoder = FrameEncoder()
        self._out = bytearray()
        self._flush_scheduled = False
        self.is_closed = False
        self._loop = asyncio.get_running_loop()
        self._auth_timer: asyncio.TimerHandle | None = None
        self._gate: HandshakeGate | None = None
        self._gate_state = ""  # "" | "waiting" | "in" (its handshake runs) | "out"
        self._held = bytearray()  # what a waiting connection sent (`_hold`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if self._gate_state == "waiting":  # not its turn: keep its bytes unread
            self._hold(data)
            return
        try:
            messages = self._decoder.feed(data)
        except Exception as exc:  # a corrupt stream cannot be resynchronised
            log.error("closing connection after undecodable frame: %s", exc)
            self.close()
            return
        for message in messages:
            if self.transport is None or self.transport.is_closing():
                return  # closed by an earlier message: the rest is not to be trusted
            try:
                self.message_received(message)
            except Exception as exc:  # a bad message must not take its neighbours down
                log.error("closing connection after a message it could not handle: %r", exc)
                self.close()

    def send(self, message: Message) -> None:
        if self.is_closed:
            return
        self._encoder.append(self._out, message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.is_closed:
            self.transport.write(bytes(self._out))
        self._out.clear()

    def expect_token(self, gate: HandshakeGate | None = None) -> None:
        """Until `token_accepted`: small frames only, and a deadline to present the token
        (an unauthenticated peer must not make us buffer a gigabyte or hold a socket).
        With a `gate` (transport/gate.py), it may first wait its turn, unread."""
        self._decoder.max_frame = PREAUTH_MAX_FRAME
        self._gate = gate
        if gate is None or gate.enter(self):
            self._gate_state = "in" if gate is not None else ""
            self._auth_timer = self._loop.call_later(PREAUTH_TIMEOUT_S, self.close)
            return
        self._gate_state = "waiting"
        if self.transport is not None:
            self.transport.pause_reading()

    def _hold(self, data: bytes) -> None:
        """Bytes that came while it waits: uvloop (0.23) starts reading a connection
        after `connection_made` even when it paused it there (as asyncio did before
        CPython gh-76002), so a waiting connection's handshake ran past the gate, and
        its turn, when it came, put the authenticated connection on the pre-auth
        deadline: closed PREAUTH_TIMEOUT_S later, and each close let the next one in,
        so a herd's members were cut in waves 10 s apart. Held (bounded as a pre-auth
        frame) until it is let in; paused again, which holds once reading has started."""
        self._held += data
        if len(self._held) > PREAUTH_MAX_FRAME:
            self._held.clear()
            self.close()
        elif self.transport is not None:
            self.transport.pause_reading()

    def admitted(self) -> None:
        """Its turn came (HandshakeGate): read it (what it sent meanwhile first), and
        start its deadline."""
        self._gate_state = "in"
        self._auth_timer = self._loop.call_later(PREAUTH_TIMEOUT_S, self.close)
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.resume_reading()
        if self._held:
            held = bytes(self._held)
            self._held.clear()
            self.data_received(held)

    def token_accepted(self) -> None:
        self._decoder.max_frame = MAX_FRAME_BYTES
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self._leave_gate()

    def _leave_gate(self) -> None:
        gate, state = self._gate, self._gate_state
        if gate is None or state in ("", "out"):
            return
        self._gate_state = "out"
        if state == "waiting":
            gate.forget(self)
        else:
            gate.leave(self)

    def close(self) -> None:
        if self.transport is not None:
            self._flush()
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self._leave_gate()
        self.closed(exc)

    def message_received(self, message: Message) -> None:
        raise NotImplementedError

    def closed(self, exc: Exception | None) -> None:
        pass
