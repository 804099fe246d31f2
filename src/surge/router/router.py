"""The router of one deployment: queue, pick a replica, send, retry on rejection.

It keeps one link per replica and counts its own in-flight requests there. A request
goes straight to a replica with room (power of two choices); otherwise it waits in a
bounded FIFO queue (its share of `max_queued_requests`) and is sent when a response
frees a slot. A full queue rejects at once with `BackPressureError`. A replica that
rejects (it is full because of other routers, or draining) counts as full until it
answers again, and the request goes back to the head of the queue.

On a multi-node backend the router knows its node: replicas there are kept at the
front of the routable list and preferred (policy.routing's `local`). Links to other
hosts use TCP keepalive, so a replica whose node vanished without closing the
connection fails its in-flight requests within seconds instead of hanging them.

Threads: the router lives on its runtime's loop, but a caller on another thread (a
driver's main thread, a replica's worker running a sync method) may start a request
itself with `try_submit`, which never queues or raises, so the common call costs the
loop no wake-up (router/handle.py); a thread that waits in `.result()` sends on, and
reads its answers from, a link of its own to the replica (own_links.py). `lock` guards
all the router's state and its links' (they share it): every method takes it, and a
thread other than the loop's only calls `try_submit`, or reads its own link.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
from collections import deque
from collections.abc import Callable

from surge.clock import SYSTEM, Clock
from surge.config import QUEUE_SAFETY_LIMIT
from surge.errors import BackPressureError, DeploymentUnavailableError
from surge.launch import LOCAL_NODE
from surge.model import DeploymentId, LoadReport, ReplicaInfo, ReplicaSet
from surge.policy.admission import admit
from surge.policy.routing import choose_replica
from surge.router.own_links import OwnLinks
from surge.router.replica_link import Pending, ReplicaLink
from surge.transport.handshake import HandshakeFailed
from surge.transport.messages import Cancel, Message, Rejected
from surge.transport.rpc import split_address

__all__ = ["Router"]

log = logging.getLogger("surge.router")

# How long a replica that rejected is treated as full if it sends us nothing else.
SATURATION_HOLD_S = 0.02
# A replica on another node must complete the token handshake within this.
HANDSHAKE_TIMEOUT_S = 10.0
# TCP keepalive on links to replicas (idle s, interval s, probes): a dead host is noticed
# in about 5 + 3 * 1 = 8 s, without a heartbeat of our own on the data path.
KEEPALIVE = (5, 1, 3)


class _Slot:
    __slots__ = ("info", "link", "saturated")

    def __init__(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        self.info = info
        self.link = link
        self.saturated = False


class _Loads:
    """In-flight counts as a lazy sequence, so picking two replicas costs O(1)."""

    __slots__ = ("capacity", "own", "slots")

    def __init__(self, slots: list[_Slot], capacity: int, own: OwnLinks) -> None:
        self.slots = slots
        self.capacity = capacity
        self.own = own

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, index: int) -> int:
        slot = self.slots[index]
        if slot.saturated:
            return self.capacity
        return len(slot.link.in_flight) + self.own.load(slot.info.replica_id)


class Router:
    def __init__(self, deployment: DeploymentId, *, rng: random.Random | None = None,
                 clock: Clock = SYSTEM, node_id: str = LOCAL_NODE) -> None:
        self.deployment = deployment
        self.lock = threading.RLock()
        self.node_id = node_id
        self.token: str | None = None  # the control token, for replicas reached over TCP
        self._local = 0  # the first `_local` routable slots are on this router's node
        self._rng = rng or random.Random()
        self._now = clock.monotonic
        self._loop = asyncio.get_running_loop()
        self._links: dict[str, ReplicaLink] = {}
        self.own_links = OwnLinks(self._loop, self._own_link, self._dial_replica,
                             lambda replica_id: replica_id in self._by_id)
        self._loop_thread = threading.get_ident()
        self._routable: list[_Slot] = []
        self._by_id: dict[str, _Slot] = {}
        self._queue: deque[Pending] = deque()
        self._max_ongoing = 1
        self._queue_limit = QUEUE_SAFETY_LIMIT  # until the controller sends the share
        self._loads = _Loads(self._routable, 1, self.own_links)
        self.replica_set: ReplicaSet | None = None
        # Set once a replica set arrived and the links it named have been tried.
        self.ready = asyncio.Event()
        self._connecting = 0
        self._tasks: set[asyncio.Task[None]] = set()  # keeps connect tasks alive
        self._rate_started = self._now()
        self._completed_in_window = 0
        self._drain_per_s = 0.0
        self.completed = 0
        self.rejected = 0
        self.arrived = 0
        self.on_pressure: Callable[[], None] | None = None
        self.closing = False  # set when surge shuts down on purpose: lost links are expected
        self._reported = (0, 0, 0, 0, 0)  # arrived, completed, rejected, queued, in flight

    def __repr__(self) -> str:
        with self.lock:
            return (f"<Router {self.deployment} replicas={len(self._routable)} "
                    f"queued={len(self._queue)}/{self._queue_limit} "
                    f"in_flight={self.in_flight} completed={self.completed} "
                    f"rejected={self.rejected} own_links={len(self.own_links.links)}>")

    @property
    def in_flight(self) -> int:
        with self.lock:
            return (sum(len(link.in_flight) for link in self._links.values())
                    + self.own_links.in_flight())

    @property
    def queued(self) -> int:
        return len(self._queue)

    # -- replica set -------------------------------------------------------------------

    def update(self, replica_set: ReplicaSet) -> None:
        with self.lock:
            self._update(replica_set)

    def _update(self, replica_set: ReplicaSet) -> None:
        self.replica_set = replica_set
        self._max_ongoing = replica_set.max_ongoing_requests
        self._queue_limit = replica_set.queue_limit
        self._loads.capacity = self._max_ongoing
        wanted = {info.replica_id: info for info in replica_set.replicas}
        for replica_id in list(self._by_id):
            if replica_id not in wanted:
                self._unroute(replica_id)
        for replica_id, info in wanted.items():
            if replica_id not in self._links:
                # Registered now, not when the task runs: a second update arriving before
                # then must not open a second link (and a second slot) to the same replica.
                link = ReplicaLink(replica_id, self._on_final, self._on_lost, self.lock)
                self._links[replica_id] = link
                self._connecting += 1
                task = self._loop.create_task(self._connect(info, link))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if not self._connecting:
            self.ready.set()
        self._drain()
        if self._unavailable() is not None:  # nothing will come: end what waits, now
            queued, self._queue = self._queue, deque()
            for pending in queued:
                error = self._unavailable()
                if error is not None and not pending.cancelled:
                    pending.sink.fail(error)  # one exception each: callers raise their own

    def _unavailable(self) -> DeploymentUnavailableError | None:
        """The error for a deployment that has no replica and will get none."""
        current = self.replica_set
        if current is None or not current.unavailable or current.replicas:
            return None
        return DeploymentUnavailableError(
            f"Deployment {self.deployment} is unavailable: {current.unavailable}.")

    async def _connect(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        try:
            await self._open_link(info, link)
        finally:
            with self.lock:
                self._connecting -= 1
                if not self._connecting:
                    self.ready.set()

    async def _dial(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        """Connect `link` to the replica; it is trusted when this returns."""
        if info.address.startswith("unix:"):
            await self._loop.create_unix_connection(lambda: link, info.address[5:])
        elif info.local_address and info.node_id == self.node_id:  # same node: no TCP
            await self._loop.create_unix_connection(lambda: link, info.local_address[5:])
        else:
            if self.token:  # TCP replicas take requests only after the handshake
                link.require_handshake(self.token)
            host, port = split_address(info.address)
            transport, _ = await self._loop.create_connection(lambda: link, host, port)
            _keepalive(transport.get_extra_info("socket"))
        await asyncio.wait_for(link.trusted, HANDSHAKE_TIMEOUT_S)

    async def _open_link(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        try:
            await self._dial(info, link)
        except (OSError, HandshakeFailed, TimeoutError) as exc:
            log.warning("cannot reach replica %s at %s: %r", info.replica_id, info.address,
                        exc)
            with self.lock:
                self._links.pop(info.replica_id, None)
                link.close()
            return
        with self.lock:
            self._route(info, link)

    def _route(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        """A link is open and trusted: send it requests (if its replica is still wanted)."""
        if self._links.get(info.replica_id) is not link:  # the router closed meanwhile
            link.close()
            return
        current = self.replica_set
        if current is None or all(r.replica_id != info.replica_id for r in current.replicas):
            self._links.pop(info.replica_id, None)
            link.close()
            return
        slot = _Slot(info, link)
        self._by_id[info.replica_id] = slot
        if info.node_id == self.node_id:
            self._routable.insert(self._local, slot)
            self._local += 1
        else:
            self._routable.append(slot)
        self._drain()

    def _remove_slot(self, slot: _Slot) -> None:
        index = self._routable.index(slot)
        del self._routable[index]
        if index < self._local:
            self._local -= 1

    def _unroute(self, replica_id: str) -> None:
        slot = self._by_id.pop(replica_id, None)
        if slot is not None:
            self._remove_slot(slot)
            for link in [slot.link, *self.own_links.unroute(replica_id)]:
                if not link.in_flight:  # the others close when their last answer comes
                    self._retire(link)

    def _retire(self, link: ReplicaLink) -> None:
        link.close()
        self.own_links.links.discard(link)
        if self._links.get(link.replica_id) is link:
            del self._links[link.replica_id]

    # -- callers' threads' own links ---------------------------------------------------

    def _own_link(self, replica_id: str, thread: int) -> ReplicaLink:
        return ReplicaLink(replica_id, self._on_final, self._on_own_lost, self.lock,
                           owner=thread)

    async def _dial_replica(self, replica_id: str, link: ReplicaLink) -> None:
        slot = self._by_id.get(replica_id)
        if slot is None:
            raise OSError(f"replica {replica_id} is gone")
        await self._dial(slot.info, link)

    def _on_own_lost(self, link: ReplicaLink) -> None:
        self.own_links.lost(link)
        self._loop.call_soon(self._drain)

    def _reclaim_thread(self, thread: int) -> None:
        with self.lock:
            self.own_links.reclaim_thread(thread)

    def reclaim_unread(self) -> None:
        """(Loop; every load report.) Read again the own links whose answers wait while
        their threads are not reading, so those calls end and count as done."""
        with self.lock:
            self.own_links.reclaim_unread()

    # -- requests ----------------------------------------------------------------------

    def try_submit(self, pending: Pending, own_link: bool = False) -> bool:
        """From a thread other than the loop's: send now if nothing is queued and a
        replica has room; False when the request must go through `submit` on the loop
        (to queue, to be rejected, or to wait for a replica set). With `own_link` (the
        thread will wait in `.result()`) it goes on the thread's own link to the replica
        when it has one, and the loop opens one for next time when it has not."""
        with self.lock:
            thread = threading.get_ident() if own_link else None
            if not self.ready.is_set() or not self._start(pending, thread):
                if thread is not None and self.own_links.unread(thread):
                    # it goes through the loop and may wait for answers nobody reads yet
                    self._loop.call_soon_threadsafe(self._reclaim_thread, thread)
                return False
            self.arrived += 1
            return True

    def _start(self, pending: Pending, thread: int | None = None) -> bool:
        """Send to the replica that power of two choices picks; False if all are full
        or others wait before it. `thread`: the caller's, for its own link."""
        if self._queue:
            return False
        index = choose_replica(self._loads, self._max_ongoing, self._rng, self._local)
        if index < 0:
            return False
        slot = self._routable[index]
        link = slot.link
        if thread is not None:
            link = self.own_links.get(slot.info.replica_id, thread) or link
        link.start(pending)
        return True

    def submit(self, pending: Pending) -> None:
        """Send now, queue, or raise BackPressureError (DeploymentUnavailableError when no
        replica will come); never blocks."""
        with self.lock:
            self.arrived += 1
            if not self._start(pending):
                self._enqueue(pending)

    def _enqueue(self, pending: Pending) -> None:
        unavailable = self._unavailable()
        if unavailable is not None:
            raise unavailable
        rejection = admit(len(self._queue), self._queue_limit, self._drain_rate())
        if rejection is not None:
            self.rejected += 1
            current = self.replica_set
            fixed = current.retry_after_s if current is not None else None
            raise BackPressureError(
                deployment=str(self.deployment), num_queued_requests=rejection.queued,
                max_queued_requests=rejection.limit,
                retry_after_s=rejection.retry_after_s if fixed is None else fixed,
                status_code=current.backpressure_status if current is not None else 503)
        self._queue.append(pending)
        if len(self._queue) == 1 and self.on_pressure is not None:
            self.on_pressure()  # the queue started to grow: tell the autoscaler now

    def cancel(self, pending: Pending) -> None:
        with self.lock:
            self._cancel(pending)

    def _cancel(self, pending: Pending) -> None:
        if pending.cancelled:
            return
        pending.cancelled = True
        if pending.link is None:
            try:
                self._queue.remove(pending)
            except ValueError:
                pass
        else:
            pending.link.send(Cancel(id=pending.message.id))
            pending.link.reclaim()  # an own link: the loop reads what the replica answers

    def _drain(self) -> None:
        with self.lock:
            queue = self._queue
            while queue:
                index = choose_replica(self._loads, self._max_ongoing, self._rng, self._local)
                if index < 0:
                    return
                pending = queue.popleft()
                if not pending.cancelled:
                    self._routable[index].link.start(pending)

    def _on_final(self, link: ReplicaLink, pending: Pending, message: Message) -> None:
        # (the link calls these two with the lock held; this one on an own link's thread
        # too, where the loop's own calls must be handed to the loop)
        slot = self._by_id.get(link.replica_id)
        if isinstance(message, Rejected):
            pending.link = None
            if slot is not None and not slot.saturated:
                slot.saturated = True
                self._on_loop(self._loop.call_later, SATURATION_HOLD_S, self._unsaturate,
                              slot)
            if not pending.cancelled:
                self._queue.appendleft(pending)
        else:
            if slot is not None:
                slot.saturated = False
            self.completed += 1
            self._completed_in_window += 1
            if not pending.cancelled:
                pending.sink.deliver(message)
        if slot is None and not link.in_flight:
            self._retire(link)
        elif link.owner is not None and not link.in_flight and not link.lent:
            link.lend()  # reclaimed, and all answered: its thread may read it again
        self._drain()

    def _on_loop(self, function: Callable[..., object], *args: object) -> None:
        if threading.get_ident() == self._loop_thread:
            function(*args)
        else:
            self._loop.call_soon_threadsafe(function, *args)

    def _unsaturate(self, slot: _Slot) -> None:
        with self.lock:
            slot.saturated = False
            self._drain()

    def _on_lost(self, link: ReplicaLink) -> None:
        if self._links.get(link.replica_id) is link:
            del self._links[link.replica_id]
        slot = self._by_id.pop(link.replica_id, None)
        if slot is not None:
            self._remove_slot(slot)
            self.own_links.reclaim_replica(link.replica_id)  # their transports see it go, too
            level = logging.DEBUG if self.closing else logging.WARNING
            log.log(level, "lost connection to replica %s of %s", link.replica_id,
                    self.deployment)
        self._loop.call_soon(self._drain)

    def _drain_rate(self) -> float:
        now = self._now()
        elapsed = now - self._rate_started
        if elapsed >= 0.5:
            self._drain_per_s = self._completed_in_window / elapsed
            self._rate_started, self._completed_in_window = now, 0
        return self._drain_per_s

    def load_report(self) -> LoadReport | None:
        """What changed since the last report, or None when nothing did."""
        with self.lock:
            now = (self.arrived, self.completed, self.rejected, len(self._queue),
                   self.in_flight)
            last = self._reported
            if now == last:
                return None
            self._reported = now
        return LoadReport(self.deployment, now[0] - last[0], now[1] - last[1],
                          now[2] - last[2], now[3], now[4])

    def close(self) -> None:
        with self.lock:
            self._routable.clear()  # no caller's thread may start a request any more
            self._by_id.clear()
            self._local = 0
            for link in self._links.values():
                link.close()
            self._links.clear()
            self.own_links.close()


def _keepalive(sock: socket.socket | None) -> None:
    if sock is None:
        return
    idle, interval, probes = KEEPALIVE
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
    except (OSError, AttributeError):  # not every platform has the TCP_KEEP* options
        pass
