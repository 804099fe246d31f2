"""The router of one deployment: queue, pick a replica, send, retry on rejection.

It keeps one link per replica and counts its own in-flight requests there. A request
goes straight to a replica with room (power of two choices); otherwise it waits in a
bounded FIFO queue and is sent when a response frees a slot. The queue is bounded by
its share of `max_queued_requests`, or, when that is unset, by time: a request that
would wait longer than the deployment's `max_queue_wait_s` (estimated from this
router's requests in flight and their measured service time, policy/admission.py) is
not queued. Either way the refusal is at once, a `BackPressureError`. A replica that
rejects (it is full because of other routers, or draining) counts as full until it
answers again, and the request goes back to the head of the queue.

A request for a multiplexed model (`model_id`: the serve_multiplexed_model_id header or
the handle option) is routed by policy/model_routing.py instead: to a replica that holds
or is loading the model (its `Models` frames say, and the router counts its own requests
sent there as holding it at once), spreading a hot model to one more replica when every
holder is full, up to the replicas' `max_copies` (default: half the replicas, at least
2); one that waited `matching_timeout_s` in the queue may go to any replica with room.
Waiting model requests do not hold up the rest: the queue is scanned (a bounded number
of entries) for one that can go.

Replicas that report their engine's queue (`record_routing_stats`: RoutingStats frames)
are chosen on it instead of on this router's in-flight counts alone, and a request with
a session id or a long shared prompt prefix prefers one replica, within a bound
(router/engine_choice.py, policy/engine_routing.py).

On a multi-node backend the router knows its node: replicas there are kept at the
front of the routable list and preferred (policy.routing's `local`). Links to other
hosts use TCP keepalive (an idle link) and TCP_USER_TIMEOUT (a link with requests sent
and not yet acknowledged: keepalive never probes those), so a replica whose host
vanished without closing the connection fails its in-flight requests within seconds
instead of hanging them until the kernel gives up (~15 minutes of retransmissions).

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
import itertools
import logging
import random
import socket
import threading
from collections import deque
from collections.abc import Callable

from surge.clock import SYSTEM, Clock
from surge.config import QUEUE_SAFETY_LIMIT
from surge.errors import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from surge.model import LOCAL_NODE, DeploymentId, LoadReport, ReplicaInfo, ReplicaSet
from surge.policy.admission import admit, drain_rate, smoothed
from surge.policy.model_routing import ModelHeat, choose_for_model
from surge.policy.routing import NO_REPLICA, choose_replica
from surge.router.engine_choice import choose_by_engine
from surge.router.own_links import OwnLinks
from surge.router.replica_link import Pending, ReplicaLink, Reservation
from surge.router.slots import Loads, Slot
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
# Data unacknowledged this long closes a link to a replica on another host: as long as the
# keepalive verdict, and far above a lossy link's retransmission backoff.
UNACKED_TIMEOUT_S = 8.0
# Queue entries one drain looks at for a model request that can go (the rest wait).
MODEL_SCAN_LIMIT = 64
# Until a multiplexed replica tells its own (Models frames).
MATCHING_TIMEOUT_S = 1.0


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
        self._routable: list[Slot] = []
        self._by_id: dict[str, Slot] = {}
        self._queue: deque[Pending] = deque()
        self._max_ongoing = 1
        self._queue_limit = QUEUE_SAFETY_LIMIT  # until the controller sends the share
        self._max_queue_wait_s: float | None = None  # the wait bound, once a set says it
        self._service_s = 0.0  # this router's requests' service time, smoothed (0: none yet)
        self._loads = Loads(self._routable, 1, self.own_links)
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
        self._matching_timer: asyncio.TimerHandle | None = None
        self._heat = ModelHeat()  # how often each model is asked for here
        # An LLM server's model id, once a replica's Models frame says so: the proxy
        # routes `<lora_base>:<adapter>` bodies by adapter (policy/llm_models.py).
        self.lora_base = ""
        self._by_engine = False  # a replica reports its engine's queue: route on it

    def __repr__(self) -> str:
        with self.lock:
            return (f"<Router {self.deployment} replicas={len(self._routable)} "
                    f"queued={len(self._queue)}/{self._queue_limit} "
                    f"in_flight={self.in_flight} completed={self.completed} "
                    f"rejected={self.rejected} own_links={len(self.own_links.links)} "
                    f"service={self._service_s * 1000:.1f}ms "
                    f"max_wait={self._max_queue_wait_s}>")

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
        self._max_queue_wait_s = replica_set.max_queue_wait_s
        self._loads.capacity = self._max_ongoing
        wanted = {info.replica_id: info for info in replica_set.replicas}
        for replica_id in list(self._by_id):
            if replica_id not in wanted:
                self._unroute(replica_id)
        for replica_id, info in wanted.items():
            if replica_id not in self._links:
                # Registered now, not when the task runs: a second update arriving before
                # then must not open a second link (and a second slot) to the same replica.
                link = ReplicaLink(replica_id, self._on_final, self._on_lost,
                                   self._on_models, self.lock)
                link.on_stats = self._on_stats
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
        slot = Slot(info, link)
        self._by_id[info.replica_id] = slot
        if info.node_id == self.node_id:
            self._routable.insert(self._local, slot)
            self._local += 1
        else:
            self._routable.append(slot)
        self._drain()

    def _remove_slot(self, slot: Slot) -> None:
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
        return ReplicaLink(replica_id, self._on_final, self._on_own_lost, lock=self.lock,
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
                return False  # (`submit` counts it, and its model's heat)
            self.arrived += 1
            model = pending.message.model_id
            if model:
                self._heat.hit(model, self._now())
            return True

    def _start(self, pending: Pending, thread: int | None = None) -> bool:
        """Send to the replica that power of two choices (or, for a model, the model
        routing) picks; False if all are full or others wait before it. `thread`: the
        caller's, for its own link."""
        model = pending.message.model_id
        if model:  # queued requests of other models must not hold it up: no FIFO check
            index = self._choose_for_model(model, False)
        elif self._queue:
            return False
        else:
            index = self._pick(pending)
        if index < 0:
            return False
        slot = self._routable[index]
        if model:
            slot.reserve(model)
        link = slot.link
        if thread is not None:
            link = self.own_links.get(slot.info.replica_id, thread) or link
        self._send(link, pending)
        return True

    def _send(self, link: ReplicaLink, pending: Pending) -> None:
        pending.sent_at = self._now()
        link.start(pending)

    def submit(self, pending: Pending) -> None:
        """Send now, queue, or raise BackPressureError (DeploymentUnavailableError when no
        replica will come); never blocks."""
        with self.lock:
            self.arrived += 1
            model = pending.message.model_id
            if model:
                self._heat.hit(model, self._now())
            if not self._start(pending):
                self._enqueue(pending, model)

    def _enqueue(self, pending: Pending, model: str) -> None:
        unavailable = self._unavailable()
        if unavailable is not None:
            raise unavailable
        wait_s = self._max_queue_wait_s
        # bounded by count: Retry-After from the completions measured; by time: from the
        # requests in flight and their service time
        drain = (self._drain_rate() if wait_s is None
                 else drain_rate(self.in_flight, self._service_s))
        rejection = admit(len(self._queue), self._queue_limit, drain, wait_s, self._service_s)
        if rejection is not None:
            self.rejected += 1
            current = self.replica_set
            fixed = current.retry_after_s if current is not None else None
            raise BackPressureError(
                deployment=str(self.deployment), num_queued_requests=rejection.queued,
                max_queued_requests=rejection.limit,
                retry_after_s=rejection.retry_after_s if fixed is None else fixed,
                status_code=current.backpressure_status if current is not None else 503,
                reason="" if wait_s is None else rejection.reason,
                # Ray's count bound: a Retry-After only when configured (as Ray);
                # surge's wait bound: always its estimate
                advise_retry=fixed is not None or wait_s is not None)
        self._queue.append(pending)
        if model:
            pending.queued_at = self._now()
            if self._matching_timer is None:
                self._matching_timer = self._loop.call_later(self._matching_timeout(),
                                                             self._matching_timed_out)
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

    # -- reservations (handle.choose_replica, then dispatch) ----------------------------

    def release(self, reservation: Reservation) -> None:
        """Free a reservation that no request came for: held, or still queued."""
        with self.lock:
            link = reservation.link
            if link is None:
                self._cancel(reservation)  # still queued (or never held)
            elif self._unhold(link, reservation):
                model = reservation.message.model_id
                slot = self._by_id.get(link.replica_id)
                if model and slot is not None:
                    slot.release(model)
                if slot is None and not link.in_flight:
                    self._retire(link)
                self._drain()

    def dispatch(self, reservation: Reservation, pending: Pending) -> None:
        """Send `pending` to the reservation's replica, in its held slot; raises
        ReplicaUnavailableError if that replica has gone (its slot is freed)."""
        with self.lock:
            link = reservation.link
            if link is None or link.replica_id not in self._by_id:
                self.release(reservation)
                raise ReplicaUnavailableError(link.replica_id if link else "(none held)")
            if not self._unhold(link, reservation):  # the link was lost meanwhile
                raise ReplicaUnavailableError(link.replica_id)
            pending.pinned = link.replica_id
            self._send(link, pending)

    def replica_info(self, replica_id: str) -> ReplicaInfo | None:
        with self.lock:
            slot = self._by_id.get(replica_id)
            return None if slot is None else slot.info

    @staticmethod
    def _unhold(link: ReplicaLink, reservation: Reservation) -> bool:
        """Take the reservation off its link's in-flight requests; False if it was not
        there (the link closed and dropped them)."""
        reservation.link = None
        return link.in_flight.pop(reservation.message.id, None) is reservation

    def _resend(self, pending: Pending) -> None:
        """(Loop.) A request pinned to a replica that rejected it (full with other
        routers' requests): try that replica again, as long as it is routable."""
        with self.lock:
            if pending.cancelled:
                return
            slot = self._by_id.get(pending.pinned)
            if slot is None:
                pending.sink.fail(ReplicaUnavailableError(pending.pinned))
            else:
                if pending.message.model_id:
                    slot.reserve(pending.message.model_id)  # as sending it first did
                self._send(slot.link, pending)

    def _drain(self) -> None:
        with self.lock:
            queue = self._queue
            while queue:
                if queue[0].message.model_id:
                    self._drain_models()
                    return
                index = self._pick(queue[0])
                if index < 0:
                    return
                pending = queue.popleft()
                if not pending.cancelled:
                    self._send(self._routable[index].link, pending)

    def _pick(self, pending: Pending) -> int:
        """Power of two choices on in-flight counts, or on the engines' queues with
        affinity once a replica reports them (router/engine_choice.py)."""
        if self._by_engine:
            return choose_by_engine(self._loads, self._max_ongoing, self._rng, self._local,
                                    pending.message, self._loop.time())
        return choose_replica(self._loads, self._max_ongoing, self._rng, self._local)

    def _on_stats(self, link: ReplicaLink) -> None:
        self._by_engine = True
        if self._queue:  # an engine other routers filled may have room again
            self._drain()

    # -- multiplexed models (policy/model_routing.py) ----------------------------------

    def _settings(self) -> tuple[int, float]:
        """(max_copies, matching_timeout_s), as the replicas' Models frames say."""
        for slot in self._routable:
            models = slot.link.models
            if models is not None:
                copies = models.max_copies or max(2, len(self._routable) // 2)
                return copies, models.matching_timeout_s
        return max(2, len(self._routable) // 2), MATCHING_TIMEOUT_S

    def _matching_timeout(self) -> float:
        return self._settings()[1]

    def _choose_for_model(self, model: str, fallback: bool) -> int:
        slots = self._routable
        if not slots:
            return NO_REPLICA
        max_copies, _ = self._settings()
        now = self._now()
        return choose_for_model(self._loads, self._max_ongoing,
                                [slot.holds(model) for slot in slots],
                                [slot.models_held() for slot in slots], max_copies,
                                self._rng, fallback,
                                [slot.coldest(self._heat, now) for slot in slots])

    def _start_model(self, slot: Slot, pending: Pending, model: str) -> None:
        slot.reserve(model)
        self._send(slot.link, pending)

    def _drain_models(self) -> None:
        """Send what can go among the first MODEL_SCAN_LIMIT queued requests, in order."""
        queue, kept = self._queue, deque[Pending]()
        now, timeout = self._now(), self._matching_timeout()
        scanned = 0
        while queue and scanned < MODEL_SCAN_LIMIT:
            pending = queue.popleft()
            if pending.cancelled:
                continue
            scanned += 1
            model = pending.message.model_id
            if model:
                index = self._choose_for_model(model, now - pending.queued_at >= timeout)
            else:
                index = self._pick(pending)
            if index < 0:
                kept.append(pending)
                if not model:  # every replica is full: nothing else can go either
                    break
                continue
            if model:
                self._start_model(self._routable[index], pending, model)
            else:
                self._send(self._routable[index].link, pending)
        kept.extend(queue)
        self._queue = kept

    def _matching_timed_out(self) -> None:
        with self.lock:
            self._matching_timer = None
            self._drain()
            waiting = [p.queued_at for p in itertools.islice(self._queue, MODEL_SCAN_LIMIT)
                       if p.message.model_id]
            if waiting:
                due = min(waiting) + self._matching_timeout() - self._now()
                self._matching_timer = self._loop.call_later(max(due, 0.01),
                                                             self._matching_timed_out)

    def _on_models(self, link: ReplicaLink) -> None:
        if link.models is not None and link.models.lora_base:
            self.lora_base = link.models.lora_base
        if self._queue:
            self._drain()  # a replica took a model on: requests waiting for it may go

    def _on_final(self, link: ReplicaLink, pending: Pending, message: Message) -> None:
        # (the link calls these two with the lock held; this one on an own link's thread
        # too, where the loop's own calls must be handed to the loop)
        slot = self._by_id.get(link.replica_id)
        model = pending.message.model_id
        if model and slot is not None:
            slot.release(model)
        if isinstance(message, Rejected):
            pending.link = None
            if slot is not None and not slot.saturated:
                slot.saturated = True
                self._on_loop(self._loop.call_later, SATURATION_HOLD_S, self._unsaturate,
                              slot)
            if pending.pinned:  # into a reservation: that replica or none
                self._on_loop(self._loop.call_later, SATURATION_HOLD_S, self._resend, pending)
            elif not pending.cancelled:
                self._queue.appendleft(pending)
        else:
            if slot is not None:
                slot.saturated = False
            self.completed += 1
            self._completed_in_window += 1
            self._service_s = smoothed(self._service_s, self._now() - pending.sent_at)
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

    def _unsaturate(self, slot: Slot) -> None:
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
            if self._matching_timer is not None:
                self._matching_timer.cancel()
                self._matching_timer = None
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
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                        int(UNACKED_TIMEOUT_S * 1000))
    except (OSError, AttributeError):  # not every platform has the TCP_KEEP* options
        pass
