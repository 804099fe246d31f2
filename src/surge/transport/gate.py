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
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

__all__ = ["DEFAULT_CONCURRENT_HANDSHAKES", "Gated", "HandshakeGate"]

DEFAULT_CONCURRENT_HANDSHAKES = 64


class Gated(Protocol):
    is_closed: bool

    def admitted(self) -> None:
        """Its turn: start reading and its handshake deadline."""
        ...


class HandshakeGate:
    def __init__(self, limit: int = DEFAULT_CONCURRENT_HANDSHAKES) -> None:
        if limit < 1:
            raise ValueError(f"a handshake gate lets at least one in, not {limit}")
        self.limit = limit
        self.running = 0
        self.waiting: deque[Gated] = deque()
        self.admitted_total = 0
        self.queued_total = 0  # connections that had to wait for their turn

    def __repr__(self) -> str:
        return (f"<HandshakeGate running={self.running}/{self.limit} "
                f"waiting={len(self.waiting)}>")

    def enter(self, connection: Gated) -> bool:
        """True: its handshake may start now; False: it waits for `admitted()`."""
        if self.running < self.limit and not self.waiting:
            self.running += 1
            self.admitted_total += 1
            return True
        self.waiting.append(connection)
        self.queued_total += 1
        return False

    def leave(self, connection: Gated) -> None:
        """Its handshake ended (done, failed or closed): the next one's turn."""
        self.running -= 1
        while self.waiting and self.running < self.limit:
            following = self.waiting.popleft()
            if following.is_closed:
                continue
            self.running += 1
            self.admitted_total += 1
            following.admitted()

    def forget(self, connection: Gated) -> None:
        """It closed while waiting."""
        try:
            self.waiting.remove(connection)
        except ValueError:
            pass
