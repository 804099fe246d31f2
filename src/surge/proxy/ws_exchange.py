"""A WebSocket exchange: the upgrade request, then messages both ways until a close.

The handshake goes to a replica like any request (admission, backpressure: a 503 comes
before any upgrade). The app's `websocket.accept` arrives as `WsAccept` and the 101 goes
out (phase OPEN); a close or denial before that is an ordinary HTTP response (403, or
the app's own). Once open:

- client messages (codecs/websocket.py parses them) go to the replica as `WsData`
  within the window it grants; past it the connection stops reading from the client;
- the app's `WsData` become frames, acknowledged once written (as streamed bodies are),
  so a slow reader holds back a chatty app;
- a close from either side ends the exchange: the client's (or its vanishing: 1006, a
  message over the limit: 1009, the idle limit: 1001) reaches the app as `WsClose`,
  sent past the window; the app's is written to the client. Its replica dying (or its
  task failing) closes the client with 1011. Frames after the close are dropped; the
  app may run on until it returns, holding its replica slot as any request does.

The request timeout covers only the wait for the accept; the idle limit covers the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surge.codecs.websocket import (
    BINARY,
    GOING_AWAY,
    INTERNAL_ERROR,
    TEXT,
    WsSession,
    accept_head,
    close_frame,
    frame,
)
from surge.proxy.exchange import Exchange, Line
from surge.proxy.h1_state import EXCHANGE, Phase, PhaseEvent
from surge.proxy.upstream import Upstream
from surge.transport.messages import Credit, Message, WsAccept, WsClose, WsData

if TYPE_CHECKING:
    from surge.proxy.head import RequestHead

__all__ = ["WsExchange"]

WAITING, OPEN, DONE = Phase.WAITING, Phase.OPEN, Phase.DONE
_ACCEPT, _MESSAGE, _END, _CUT = (PhaseEvent.ACCEPT, PhaseEvent.MESSAGE, PhaseEvent.END,
                                 PhaseEvent.CUT)
_GONE = PhaseEvent.GONE
ABNORMAL = 1006  # the client went away without a close (what the app hears)
SWITCHING = 101


class WsExchange(Exchange):
    __slots__ = ("close_code", "ws")

    def __init__(self, line: Line, head: RequestHead, key: bytes,
                 max_message: int, started: float) -> None:
        super().__init__(line, head, b"", False, started)
        self.ws = WsSession(key, max_message, started)
        self.upstream = Upstream()
        self.close_code = 0  # how it closed, once it did

    def __repr__(self) -> str:
        return (f"<WsExchange {self.head.path!r} {self.phase.value} status={self.status} "
                f"close={self.close_code} {self.upstream!r}>")

    # -- from the client -----------------------------------------------------------------

    def data_received(self, data: bytes, now: float) -> None:
        if self.phase is not OPEN and self.phase is not WAITING:
            return  # closed: whatever the client still says is not heard
        said = self.ws.receive(data, now)
        if self.phase is OPEN:  # before the 101, a pong (or close) would not be HTTP
            self._flush_ws()
        upstream = self.upstream
        assert upstream is not None
        for message in said:
            if isinstance(message, WsData):
                upstream.push(message, len(message.data))
            else:
                self._client_closed(message)
                return
        self.send_ready()

    def _client_closed(self, close: WsClose, in_line: bool = True) -> None:
        if self.phase is WAITING:  # closed before the handshake finished: give it up
            self.ws.out.clear()
            self.line.close_now(self)
            return
        self.close_code = close.code
        self.outbox.sends.append((self, close))  # past the window: the app must hear it
        self.phase = EXCHANGE[self.phase][_END]
        if in_line:
            self._finish()
        else:  # the connection already let go of it
            self.outbox.records.append(self)

    def idle(self, now: float, limit: float) -> None:
        """The sweeper's tick: close a socket quiet for `limit` seconds (1001 both ways)."""
        if self.phase is OPEN and now - self.ws.last_active >= limit:
            self.going_away("idle timeout")

    def going_away(self, reason: str) -> None:
        """Close an open socket with 1001, toward the client and the app alike."""
        if self.phase is OPEN:
            close = self.ws.close(GOING_AWAY, reason)
            self._flush_ws()
            self._client_closed(close)

    def gone(self) -> None:
        phase = self.phase
        if phase is OPEN:  # the transport is gone: the app hears 1006
            self.ws.closed = True
            self._client_closed(WsClose(id=0, code=ABNORMAL), in_line=False)
        elif phase is WAITING:  # never detached: a socket without its client is nothing
            self.phase = EXCHANGE[phase][_GONE]
            self.status = 499
            self.outbox.records.append(self)
            self.outbox.cancels.append(self)
        else:
            super().gone()

    def timed_out(self, timeout_s: float) -> None:
        if self.phase is WAITING:
            super().timed_out(timeout_s)  # no accept in time: 408, as any request

    # -- from the replica ----------------------------------------------------------------

    def on_frame(self, message: Message) -> None:
        phase = self.phase
        if phase is OPEN:
            if isinstance(message, WsData):
                self.phase = EXCHANGE[phase][_MESSAGE]
                self.ws.last_active = self.line.now()
                self._write(frame(TEXT if message.text else BINARY, message.data),
                            len(message.data))
            elif isinstance(message, Credit):
                self.credit(message.amount)
            elif isinstance(message, WsClose):
                self._server_closed(message.code, message.reason)
            else:  # a Failure: the app's task failed or was cancelled
                self._server_closed(INTERNAL_ERROR, "", _CUT)
        elif phase is WAITING and isinstance(message, WsAccept):
            self._accept(message)
        elif phase is DONE:
            self.phase = EXCHANGE[phase][_MESSAGE]  # after the close: dropped
        elif isinstance(message, Credit):
            self.credit(message.amount)
        else:  # a denial, a failure before the accept: an HTTP answer
            super().on_frame(message)

    def on_failure(self, exc: BaseException) -> None:
        if self.phase is OPEN:  # its replica died (or the router gave up on it)
            self._server_closed(INTERNAL_ERROR, "replica died", _CUT)
        elif self.phase is not DONE:
            super().on_failure(exc)

    def _accept(self, message: WsAccept) -> None:
        self.phase = EXCHANGE[self.phase][_ACCEPT]
        self.status = SWITCHING
        self.ws.last_active = self.line.now()
        self._write(accept_head(self.ws.key, message.subprotocol, message.headers,
                                self.head.request_id))
        self._flush_ws()

    def _server_closed(self, code: int, reason: str, event: PhaseEvent = _END) -> None:
        self.close_code = code
        if not self.ws.closed:
            self.ws.closed = True
            self._write(close_frame(code, reason))
        self.phase = EXCHANGE[self.phase][event]
        self._finish()

    def _flush_ws(self) -> None:
        out = self.ws.take_out() if self.ws.out else b""
        if out:
            self._write(out)
