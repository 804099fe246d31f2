"""Connections that have not proved themselves yet are let in a bounded few at a time.

A herd of replicas and proxies (hundreds starting at once, or reconnecting to a
restarted controller) opens hundreds of control connections together. Each must
complete the token handshake (transport/handshake.py) before anything it sends is
trusted, within a deadline (connection.PREAUTH_TIMEOUT_S). Let in all together, a
busy controller serves every handshake slowly and their deadlines expire together. A
`HandshakeGate` lets `limit` handshakes run at once; the others wait without being read
(their frames stay in the kernel's buffers), first come first served, and their
deadline starts when they are let in. Clients wait for their turn
(rpc.HANDSHAKE_TIMEOUT_S) instead of giving up.

A connection that waited longer than its client waits (`patience`, less the time a
handshake needs) is closed unread when its turn comes: its client has given up (and is
likely queued again on a new connection), and a waiting connection is not read, so its
close goes unnoticed until then. Handshaking it would spend a turn for nothing, and a
herd whose queue outgrew the patience would otherwise admit only the dead.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from surge.clock import SYSTEM, Clock

__all__ = ["DEFAULT_CONCURRENT_HANDSHAKES", "DEFAULT_PATIENCE_S", "Gated", "HandshakeGate"]

DEFAULT_CONCURRENT_HANDSHAKES = 64
# rpc.HANDSHAKE_TIMEOUT_S (30 s: how long a client waits for its handshake, connect
# included) less the few seconds its handshake needs once let in.
DEFAULT_PATIENCE_S = 25.0


class Gated(Protocol):
    is_closed: bool

    def admitted(self) -> None:
        """Its turn: start reading and its handshake deadline."""
        ...

    def close(self) -> None:
        """It waited longer than its client does: hang up, unread."""
        ...


class HandshakeGate:
    def __init__(self, limit: int = DEFAULT_CONCURRENT_HANDSHAKES,
                 patience_s: float = DEFAULT_PATIENCE_S, clock: Clock = SYSTEM) -> None:
        if limit < 1:
            raise ValueError(f"a handshake gate lets at least one in, not {limit}")
        self.limit = limit
        self.patience_s = patience_s
        self.clock = clock
        self.running = 0
        self.waiting: deque[tuple[float, Gated]] = deque()  # (queued at, connection)
        self.admitted_total = 0
        self.queued_total = 0  # connections that had to wait for their turn
        self.expired_total = 0  # closed unread: they waited past their client's patience

    def __repr__(self) -> str:
        return (f"<HandshakeGate running={self.running}/{self.limit} "
                f"waiting={len(self.waiting)} expired={self.expired_total}>")

    def enter(self, connection: Gated) -> bool:
        """True: its handshake may start now; False: it waits for `admitted()`."""
        if self.running < self.limit and not self.waiting:
            self.running += 1
            self.admitted_total += 1
            return True
        self.waiting.append((self.clock.monotonic(), connection))
        self.queued_total += 1
        return False

    def leave(self, connection: Gated) -> None:
        """Its handshake ended (done, failed or closed): the next one's turn."""
        self.running -= 1
        oldest = self.clock.monotonic() - self.patience_s
        while self.waiting and self.running < self.limit:
            queued_at, following = self.waiting.popleft()
            if following.is_closed:
                continue
            if queued_at < oldest:
                self.expired_total += 1
                following.close()
                continue
            self.running += 1
            self.admitted_total += 1
            following.admitted()

    def forget(self, connection: Gated) -> None:
        """It closed while waiting (`is_closed`): it is skipped when its turn comes, so a
        herd's hang-ups cost one step each, not a search of the queue."""
