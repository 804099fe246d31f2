"""The lifecycles of an HTTP/1.1 connection and of each exchange on it, as data.

Two state enums, two event enums and one table each, in the manner of h11's
`_state.py`. `CONNECTION` is the reading side of a connection: IDLE -> HEADERS -> BODY
-> IDLE for each request, CLOSING once no further request will be read (a refusal, a
last request), UPGRADED once a WebSocket handshake was read (what follows is frames),
CLOSED. `EXCHANGE` is one request's way from being read to answered or
abandoned. A state changes only by looking its move up, `TABLE[state][event]`; a pair
not in the table is a bug in surge, never something a client can cause, and raises
`H1StateError` (each row is a `Moves`, a dict whose `__missing__` raises it).

The lookups are consulted several times per request, so they stay in C: the enums hash
by identity (`object.__hash__`; Enum's own `__hash__` is Python code) and a move is two
dict lookups, not a function call.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

__all__ = ["CONNECTION", "EXCHANGE", "Conn", "ConnEvent", "H1StateError", "Moves", "Phase",
           "PhaseEvent", "table"]


class H1StateError(Exception):
    """An event the state tables do not allow in the current state (a bug in surge)."""


S = TypeVar("S")
E = TypeVar("E")


class Moves(dict[E, S], Generic[E, S]):
    """One row of a table: event -> next state, for the state `state`."""

    __slots__ = ("state",)

    def __init__(self, state: enum.Enum, moves: Mapping[E, S]) -> None:
        super().__init__(moves)
        self.state = state

    def __missing__(self, event: E) -> S:
        name = event.name if isinstance(event, enum.Enum) else repr(event)
        raise H1StateError(f"{name} is not allowed in {self.state.name}")


K = TypeVar("K", bound=enum.Enum)


def table(rows: Mapping[K, Mapping[E, K]]) -> dict[K, Moves[E, K]]:
    return {state: Moves(state, moves) for state, moves in rows.items()}


class Conn(enum.Enum):
    """Where a connection's reading side is."""

    __hash__ = object.__hash__

    IDLE = "idle"  # between requests (keep-alive); swept after keep_alive_timeout_s
    HEADERS = "headers"  # reading a request line and headers (request_header_timeout_s)
    BODY = "body"  # reading a body (request_body_timeout_s without progress)
    CLOSING = "closing"  # no further request is read; closes once what is owed is written
    UPGRADED = "upgraded"  # a WebSocket: the bytes that follow are its frames
    CLOSED = "closed"  # closed by us, or lost


class ConnEvent(enum.Enum):
    __hash__ = object.__hash__

    BEGIN = "begin"  # a request's first byte
    HEADERS_END = "headers_end"  # its headers are in
    END = "end"  # the request is in, and more may follow (keep-alive)
    LAST = "last"  # the request is in and is the last (close, HTTP/1.0, Upgrade)
    UPGRADE = "upgrade"  # a WebSocket handshake is in: frames follow
    REFUSE = "refuse"  # unreadable, too large or too slow: answered, then closed
    DECLINE = "decline"  # over the connection cap: answered at once, closed
    CLOSE = "close"  # a response that ends the connection has been written
    IDLE_TIMEOUT = "idle_timeout"  # idle longer than keep_alive_timeout_s
    LOST = "lost"  # the transport is gone


_READING = {ConnEvent.REFUSE: Conn.CLOSING, ConnEvent.CLOSE: Conn.CLOSED,
            ConnEvent.LOST: Conn.CLOSED}

CONNECTION: Mapping[Conn, Moves[ConnEvent, Conn]] = table({
    Conn.IDLE: {ConnEvent.BEGIN: Conn.HEADERS, ConnEvent.DECLINE: Conn.CLOSED,
                ConnEvent.IDLE_TIMEOUT: Conn.CLOSED, **_READING},
    Conn.HEADERS: {ConnEvent.HEADERS_END: Conn.BODY, **_READING},
    Conn.BODY: {ConnEvent.END: Conn.IDLE, ConnEvent.LAST: Conn.CLOSING,
                ConnEvent.UPGRADE: Conn.UPGRADED, **_READING},
    Conn.UPGRADED: {ConnEvent.CLOSE: Conn.CLOSED, ConnEvent.LOST: Conn.CLOSED},
    Conn.CLOSING: {ConnEvent.CLOSE: Conn.CLOSED, ConnEvent.LOST: Conn.CLOSED},
    Conn.CLOSED: {ConnEvent.LOST: Conn.CLOSED},  # we closed it; then the transport says so
})


class Phase(enum.Enum):
    """Where one exchange (a request and its response) is."""

    __hash__ = object.__hash__

    QUEUED = "queued"  # read; not yet sent to a router (or answered by the proxy itself)
    WAITING = "waiting"  # at its router or replica; no response frame yet
    STREAMING = "streaming"  # a streamed response's head is out; its body follows
    OPEN = "open"  # a WebSocket the app accepted: messages both ways until a close
    DONE = "done"  # answered in full, or cut off; written once its turn comes
    DETACHED = "detached"  # client gone, the request runs on (x-request-disconnect-disabled)
    ABANDONED = "abandoned"  # client gone; cancelled wherever it was (logged as 499)


class PhaseEvent(enum.Enum):
    __hash__ = object.__hash__

    DISPATCH = "dispatch"  # sent to its route's router
    STREAM = "stream"  # the head of a streamed response, a body to follow
    ACCEPT = "accept"  # the app accepted a WebSocket: the 101 goes out
    MESSAGE = "message"  # a WebSocket message, either way (or one dropped after the close)
    BODY = "body"  # more of that body
    END = "end"  # the whole answer: one frame, the last body frame, or the proxy's own
    CUT = "cut"  # the stream failed or ran out of time after its head: the close ends it
    GONE = "gone"  # the client went away
    DETACH = "detach"  # the client went away from a request that runs on regardless
    FRAME = "frame"  # a frame for a detached request: nobody reads it
    SETTLE = "settle"  # a detached request ended, or its deadline passed


_GONE = {PhaseEvent.GONE: Phase.ABANDONED, PhaseEvent.DETACH: Phase.DETACHED}

EXCHANGE: Mapping[Phase, Moves[PhaseEvent, Phase]] = table({
    Phase.QUEUED: {PhaseEvent.DISPATCH: Phase.WAITING, PhaseEvent.END: Phase.DONE,
                   PhaseEvent.GONE: Phase.ABANDONED},
    Phase.WAITING: {PhaseEvent.STREAM: Phase.STREAMING, PhaseEvent.END: Phase.DONE,
                    PhaseEvent.ACCEPT: Phase.OPEN, **_GONE},
    Phase.STREAMING: {PhaseEvent.BODY: Phase.STREAMING, PhaseEvent.END: Phase.DONE,
                      PhaseEvent.CUT: Phase.DONE, **_GONE},
    # Closed either way (END), or cut when its replica died (CUT: 1011). A client that
    # vanishes is a close too (1006): the app hears it as websocket.disconnect.
    Phase.OPEN: {PhaseEvent.MESSAGE: Phase.OPEN, PhaseEvent.END: Phase.DONE,
                 PhaseEvent.CUT: Phase.DONE},
    # Answered: a close changes nothing; a WebSocket's frames after its close are dropped.
    Phase.DONE: {PhaseEvent.GONE: Phase.DONE, PhaseEvent.MESSAGE: Phase.DONE},
    Phase.DETACHED: {PhaseEvent.FRAME: Phase.DETACHED, PhaseEvent.SETTLE: Phase.ABANDONED},
    Phase.ABANDONED: {},
})
