"""Callers' threads' own links to replicas: the read side of the blocking fast path.

A thread that waits in `.result()` (a driver's main thread, a replica's worker running a
sync method) waits for one answer. On the router's shared link that answer wakes the
loop's thread, which then wakes the caller: two wake-ups and a hand-off per call. So
such a thread gets a link of its own to each replica it calls (at most MAX_PER_REPLICA
threads per replica): the loop opens it (the handshake included) and lends its reading
to the thread (transport/threadsafe.py); the thread sends its calls there and, waiting
in `.result()`, reads and handles their answers itself. A router holds at most
MAX_OWN_LINKS of them in all (each is three descriptors here and a connection at its
replica); beyond that, threads share the router's links as before.

Routing does not change: the router picks the replica first (in-flight counts are summed
over all its links, `in_flight`), then the caller's own link to it if there is one. The
loop reads an own link again (`reclaim`) whenever its thread will not read what is in
flight there: the response is awaited, cancelled or dropped, the thread's next call has
to queue, or (`reclaim_unread`, every load report) answers wait while it does something
else; the router lends it again once nothing is in flight. Everything here is guarded by
the router's lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from surge.router.replica_link import ReplicaLink
from surge.transport.handshake import HandshakeFailed

__all__ = ["MAX_OWN_LINKS", "MAX_PER_REPLICA", "OwnLinks"]

log = logging.getLogger("surge.router")

# Callers' threads with a link of their own to one replica; more share the router's
# (each costs the replica a connection; a driver or a sync replica rarely has more).
MAX_PER_REPLICA = 16
# Own links of one router in all: a driver calling many replicas from many threads must
# not run out of descriptors (the soft limit is often 1,024; each link holds three).
MAX_OWN_LINKS = 64


class OwnLinks:
    """One router's own links, by replica and thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 make: Callable[[str, int], ReplicaLink],
                 dial: Callable[[str, ReplicaLink], Coroutine[Any, Any, None]],
                 routed: Callable[[str], bool]) -> None:
        self._loop = loop
        self._make = make  # (replica id, thread) -> an unconnected own link
        self._dial = dial  # connects a link to a replica, handshake included
        self._routed = routed  # whether requests still go to a replica
        self._by_replica: dict[str, dict[int, ReplicaLink]] = {}  # routed replicas only
        self._opening: set[tuple[str, int]] = set()
        self.links: set[ReplicaLink] = set()  # all, a retired replica's too
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<OwnLinks {len(self.links)} links, {len(self._opening)} opening>"

    def get(self, replica_id: str, thread: int) -> ReplicaLink | None:
        """`thread`'s own link to the replica; asks the loop to open one if it has none."""
        link = self._by_replica.get(replica_id, {}).get(thread)
        if link is not None and not link.is_closed:
            return link
        key = (replica_id, thread)
        if key not in self._opening and self._room(replica_id):
            self._opening.add(key)
            self._loop.call_soon_threadsafe(self._open, replica_id, thread)
        return None

    def _room(self, replica_id: str) -> bool:
        """Whether one more own link may open to the replica."""
        if len(self.links) + len(self._opening) >= MAX_OWN_LINKS:
            return False
        opening = sum(1 for r, _ in self._opening if r == replica_id)
        return len(self._by_replica.get(replica_id, ())) + opening < MAX_PER_REPLICA

    def load(self, replica_id: str) -> int:
        """Requests in flight on own links to the replica."""
        own = self._by_replica.get(replica_id)
        return sum(len(link.in_flight) for link in own.values()) if own else 0

    def in_flight(self) -> int:
        return sum(len(link.in_flight) for link in self.links)

    def _open(self, replica_id: str, thread: int) -> None:
        task = self._loop.create_task(self._connect(self._make(replica_id, thread)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, link: ReplicaLink) -> None:
        assert link.owner is not None
        key = (link.replica_id, link.owner)
        try:
            await self._dial(link.replica_id, link)
        except (OSError, HandshakeFailed, TimeoutError) as exc:
            log.debug("no own link to replica %s: %r", link.replica_id, exc)
            link.close()
            with link.lock:
                self._opening.discard(key)
            return
        with link.lock:
            self._opening.discard(key)
            if not self._routed(link.replica_id):  # gone meanwhile
                link.close()
                return
            self._by_replica.setdefault(link.replica_id, {})[link.owner] = link
            self.links.add(link)
            link.lend()  # its thread reads it; nothing is in flight yet

    def lost(self, link: ReplicaLink) -> None:
        self.links.discard(link)
        own = self._by_replica.get(link.replica_id)
        if own is not None and link.owner is not None and own.get(link.owner) is link:
            del own[link.owner]

    def unroute(self, replica_id: str) -> list[ReplicaLink]:
        """The replica takes no more requests: its own links, for the router to retire
        (the idle ones now, the others at their last answer)."""
        return list(self._by_replica.pop(replica_id, {}).values())

    def reclaim_replica(self, replica_id: str) -> None:
        """The replica's shared link is lost: read its own links too, so that their
        transports see the replica go."""
        for link in self._by_replica.get(replica_id, {}).values():
            link.reclaim()

    def reclaim_thread(self, thread: int) -> None:
        for link in self.links:
            if link.owner == thread:
                link.reclaim()

    def unread(self, thread: int) -> bool:
        """Whether answers may wait on `thread`'s own links."""
        return any(link.owner == thread and link.in_flight for link in self.links)

    def reclaim_unread(self) -> None:
        """Read again the own links whose answers wait while their threads do not read."""
        for link in self.links:
            if link.lent and link.in_flight and not link.reading:
                link.reclaim()

    def close(self) -> None:
        for link in self.links:
            link.close()
        self.links.clear()
        self._by_replica.clear()
