"""The router of one deployment: queue, pick a replica, send, retry on rejection.

This is the shell: it holds the queue, the timers and the lock, and does what
policy/dispatch.py decides on plain data (queue or refuse, which queued requests go,
what a rejection means) with the time of its one injected clock; its replicas (one link
each, the routable ones and their load) are router/pool.py's. (It is over 500 lines
because every way a request goes through it lives here: submitted on the loop or from a
caller's thread, queued, reserved and dispatched, answered, rejected, shed, lost.)

It keeps one link per replica and counts its own in-flight requests there. A request
goes straight to a replica with room (power of two choices); otherwise it waits in a
bounded FIFO queue and is sent when a response frees a slot. The queue is bounded by
its share of `max_queued_requests`, or, when that is unset, by time: a request that
would wait longer than the deployment's `max_queue_wait_s` (estimated from this
router's requests in flight and their measured service time, policy/admission.py) is
not queued. Either way the refusal is at once, a `BackPressureError`. A replica that
rejects (it is full because of other routers, or draining) counts as full until it
answers again, and the request goes back to the head of the queue. So, once, does a
request an LLM replica shed (a 429 marked `x-surge-shed`: its engine's prefill backlog
would miss the TTFT objective) while another replica may take it (policy/dispatch.py
`retry_shed`); a replica's own 429 or 503 is answered but is no completion (`served`).

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
a session id prefers one replica, within a bound (router/engine_choice.py,
policy/engine_routing.py). An OpenAI chat or completion goes, from a deployment's first
request, to the replica holding the longest prefix of its prompt, within the same bound
(policy/prefix_index.py; the index lives in the pool). Such replicas queue in their
engines, not here, so this router's queue never starts to grow and tells the autoscaler
nothing early: a jump in its arrivals does instead (`on_pressure`, policy/arrival_jump.py).

On a multi-node backend the router knows its node: replicas there are kept at the
front of the routable list and preferred (policy.routing's `local`). Links to other
hosts notice a vanished host within seconds (router/dial.py).

Threads: the router lives on its runtime's loop, but a caller on another thread (a
driver's main thread, a replica's worker running a sync method) may start a request
itself with `try_submit`, which never queues or raises, so the common call costs the
loop no wake-up (router/responses.py); a thread that waits in `.result()` sends on, and
reads its answers from, a link of its own to the replica (own_links.py). `lock` guards
all the router's state and its links' (they share it): every method takes it, and a
thread other than the loop's only calls `try_submit`, or reads its own link.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import random
import threading
from collections import deque
from collections.abc import Callable

from surge.clock import SYSTEM, Clock
from surge.config import QUEUE_SAFETY_LIMIT
from surge.errors import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from surge.model import LOCAL_NODE, DeploymentId, LoadReport, ReplicaInfo, ReplicaSet
from surge.policy.admission import smoothed
from surge.policy.arrival_jump import ArrivalWatch
from surge.policy.dispatch import (
    MODEL_SCAN_LIMIT,
    SATURATION_HOLD_S,
    CompletionRate,
    after_rejection,
    drain,
    model_settings,
    next_matching_due,
    queues_at_any_load,
    refuse,
    retry_shed,
    served,
)
from surge.policy.model_routing import ModelHeat, choose_for_model
from surge.policy.routing import NO_REPLICA, choose_replica
from surge.router.dial import dial
from surge.router.engine_choice import choose_by_engine, prompt_chunks
from surge.router.own_links import OwnLinks
from surge.router.pool import ReplicaPool
from surge.router.replica_link import Pending, ReplicaLink, Reservation
from surge.router.slots import Slot
from surge.transport.handshake import HandshakeFailed
from surge.transport.messages import (
    Cancel,
    HttpRequest,
    HttpStart,
    Message,
    PrefixHeld,
    Rejected,
)

__all__ = ["Router"]

log = logging.getLogger("surge.router")

# What policy/dispatch.drain reads of a queued request: attribute reads in C, not a
# Python call per entry looked at.
_model_of: Callable[[Pending], str] = operator.attrgetter("message.model_id")
_cancelled: Callable[[Pending], bool] = operator.attrgetter("cancelled")


class Router:
    def __init__(self, deployment: DeploymentId, *, rng: random.Random | None = None,
                 clock: Clock = SYSTEM, node_id: str = LOCAL_NODE) -> None:
        self.deployment = deployment
        self.lock = threading.RLock()
        self.node_id = node_id
        self.token: str | None = None  # the control token, for replicas reached over TCP
        self._rng = rng or random.Random()
        self._now = clock.monotonic
        self._loop = asyncio.get_running_loop()
        self.own_links = OwnLinks(self._loop, self._own_link, self._dial_replica,
                                  lambda replica_id: replica_id in self.pool.by_id)
        self.pool = ReplicaPool(node_id, self.own_links)
        self._loop_thread = threading.get_ident()
        self._queue: deque[Pending] = deque()
        self._max_ongoing = 1
        self._queue_limit = QUEUE_SAFETY_LIMIT  # until the controller sends the share
        self._max_queue_wait_s: float | None = None  # the wait bound, once a set says it
        self._service_s = 0.0  # this router's requests' service time, smoothed (0: none yet)
        self.replica_set: ReplicaSet | None = None
        self._no_replica_coming = False  # the set says none will come (_unavailable)
        # Set once a replica set arrived and the links it named have been tried.
        self.ready = asyncio.Event()
        self._connecting = 0
        self._tasks: set[asyncio.Task[None]] = set()  # keeps connect tasks alive
        self.completed = 0
        self._rate = CompletionRate(self._now(), self.completed)
        self.rejected = 0
        self.arrived = 0
        # Called when the queue starts to grow, or arrivals jump: report to the autoscaler now
        self.on_pressure: Callable[[], None] | None = None
        self.closing = False  # set when surge shuts down on purpose: lost links are expected
        self._reported = (0, 0, 0, 0, 0)  # arrived, completed, rejected, queued, in flight
        self._reported_at = self._now()  # when: the next report's counters cover since
        self._matching_timer: asyncio.TimerHandle | None = None
        self._heat = ModelHeat()  # how often each model is asked for here
        # An LLM server's model id, once a replica's Models frame says so: the proxy
        # routes `<lora_base>:<adapter>` bodies by adapter (policy/llm_models.py).
        self.lora_base = ""
        self._by_engine = False  # a replica reports its engine's queue: route on it
        # ... and its engines queue, not this router: a jump in arrivals is reported at
        # once instead (policy/arrival_jump.py)
        self._watch = ArrivalWatch()
        self._watched = (0, self._now())  # arrivals, when: the watch's last report
        self._prefix_routing = True  # the set's: OpenAI prompts go by the prefix held
        # (now, matching timeout) for the drain under way, read at its first model
        # request (_choose)
        self._drain_times: tuple[float, float] | None = None

    def __repr__(self) -> str:
        with self.lock:
            return (f"<Router {self.deployment} replicas={len(self.pool)} "
                    f"queued={len(self._queue)}/{self._queue_limit} "
                    f"in_flight={self.in_flight} completed={self.completed} "
                    f"rejected={self.rejected} own_links={len(self.own_links.links)} "
                    f"service={self._service_s * 1000:.1f}ms "
                    f"max_wait={self._max_queue_wait_s}>")

    @property
    def in_flight(self) -> int:
        with self.lock:
            return self.pool.in_flight

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
        self._prefix_routing = replica_set.prefix_routing
        self._no_replica_coming = bool(replica_set.unavailable) and not replica_set.replicas
        self.pool.loads.capacity = self._max_ongoing
        wanted = {info.replica_id: info for info in replica_set.replicas}
        for replica_id in list(self.pool.by_id):
            if replica_id not in wanted:
                self.pool.unroute(replica_id)
        for replica_id, info in wanted.items():
            if replica_id not in self.pool.links:
                # Registered now, not when the task runs: a second update arriving before
                # then must not open a second link (and a second slot) to the same replica.
                link = ReplicaLink(replica_id, self._on_final, self._on_lost,
                                   self._on_models, self.lock, clock=self._now)
                link.on_stats = self._on_stats
                link.on_prefix = self._on_prefix
                self.pool.links[replica_id] = link
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
        await dial(self._loop, info, link, self.node_id, self.token)

    async def _open_link(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        try:
            await self._dial(info, link)
        except (OSError, HandshakeFailed, TimeoutError) as exc:
            log.warning("cannot reach replica %s at %s: %r", info.replica_id, info.address,
                        exc)
            with self.lock:
                self.pool.links.pop(info.replica_id, None)
                link.close()
            return
        with self.lock:
            self._route(info, link)

    def _route(self, info: ReplicaInfo, link: ReplicaLink) -> None:
        """A link is open and trusted: send it requests (if its replica is still wanted)."""
        if self.pool.links.get(info.replica_id) is not link:  # the router closed meanwhile
            link.close()
            return
        current = self.replica_set
        if current is None or all(r.replica_id != info.replica_id for r in current.replicas):
            self.pool.links.pop(info.replica_id, None)
            link.close()
            return
        self.pool.add(info, link)
        self._drain()

    # -- callers' threads' own links ---------------------------------------------------

    def _own_link(self, replica_id: str, thread: int) -> ReplicaLink:
        return ReplicaLink(replica_id, self._on_final, self._on_own_lost, lock=self.lock,
                           owner=thread, clock=self._now)

    async def _dial_replica(self, replica_id: str, link: ReplicaLink) -> None:
        slot = self.pool.by_id.get(replica_id)
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
            if self._count_arrival(pending) and self.on_pressure is not None:
                self._loop.call_soon_threadsafe(self.on_pressure)  # (not the loop's thread)
            return True

    def _start(self, pending: Pending, thread: int | None = None) -> bool:
        """Send to the replica that power of two choices (or, for a model, the model
        routing) picks; False if all are full or others wait before it. `thread`: the
        caller's, for its own link."""
        if not pending.message.model_id:
            if pending.prefix is None and self._prefix_routing:
                # read once, here (its choices read it); only a POST may carry one, and
                # the others are told apart without a call (every request comes here)
                pending.prefix = prompt_chunks(pending, self.pool.prompt_names) \
                    if pending.message.method == "POST" else []
            if self._queue:
                return False  # FIFO; queued requests of other models do not hold a model's up
        index = self._choose(pending, False)
        if index < 0:
            return False
        self._go(pending, index, thread)
        return True

    def _go(self, pending: Pending, index: int, thread: int | None = None) -> None:
        """Send `pending` to the routable replica at `index` (its model reserved there)."""
        slot = self.pool.routable[index]
        model = pending.message.model_id
        if model:
            slot.reserve(model)
        if thread is None:
            slot.link.start(pending)
        else:
            (self.own_links.get(slot.info.replica_id, thread) or slot.link).start(pending)

    def submit(self, pending: Pending) -> None:
        """Send now, queue, or raise BackPressureError (DeploymentUnavailableError when no
        replica will come); never blocks."""
        with self.lock:
            if self._count_arrival(pending) and self.on_pressure is not None:
                self.on_pressure()  # arrivals jumped: tell the autoscaler now
            if not self._start(pending):
                self._enqueue(pending, pending.message.model_id)

    def _enqueue(self, pending: Pending, model: str) -> None:
        if self._no_replica_coming:  # (a flag: every request that queues comes here)
            unavailable = self._unavailable()
            if unavailable is not None:
                raise unavailable
        queued, limit, wait_s = len(self._queue), self._queue_limit, self._max_queue_wait_s
        # Bounded by count, the completion rate (a refusal's Retry-After) is measured over
        # windows that start as requests queue; bounded by time, the in-flight count is
        # read (a sum over the links) only when a refusal is possible at all.
        rate = self._rate.per_s(self._now(), self.completed) if wait_s is None else 0.0
        if not queues_at_any_load(queued, limit, wait_s, self._service_s):
            self._refuse(queued, limit, wait_s, rate)
        self._queue.append(pending)
        if model:
            pending.queued_at = self._now()
            if self._matching_timer is None:
                self._matching_timer = self._loop.call_later(self._matching_timeout(),
                                                             self._matching_timed_out)
        if len(self._queue) == 1 and self.on_pressure is not None:
            self.on_pressure()  # the queue started to grow: tell the autoscaler now

    def _refuse(self, queued: int, limit: int, wait_s: float | None, rate: float) -> None:
        """Raise BackPressureError if policy/dispatch.refuse says so."""
        current = self.replica_set
        refusal = refuse(
            queued, limit, wait_s, self.pool.in_flight, self._service_s, rate,
            current.retry_after_s if current is not None else None,
            current.backpressure_status if current is not None else 503)
        if refusal is not None:
            self.rejected += 1
            raise BackPressureError(
                deployment=str(self.deployment), num_queued_requests=refusal.queued,
                max_queued_requests=refusal.limit, retry_after_s=refusal.retry_after_s,
                status_code=refusal.status_code, reason=refusal.reason,
                advise_retry=refusal.advise_retry)

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
                slot = self.pool.by_id.get(link.replica_id)
                if model and slot is not None:
                    slot.release(model)
                if slot is None and not link.in_flight:
                    self.pool.retire(link)
                self._drain()

    def dispatch(self, reservation: Reservation, pending: Pending) -> None:
        """Send `pending` to the reservation's replica, in its held slot; raises
        ReplicaUnavailableError if that replica has gone (its slot is freed)."""
        with self.lock:
            link = reservation.link
            if link is None or link.replica_id not in self.pool.by_id:
                self.release(reservation)
                raise ReplicaUnavailableError(link.replica_id if link else "(none held)")
            if not self._unhold(link, reservation):  # the link was lost meanwhile
                raise ReplicaUnavailableError(link.replica_id)
            pending.pinned = link.replica_id
            link.start(pending)

    def replica_info(self, replica_id: str) -> ReplicaInfo | None:
        with self.lock:
            slot = self.pool.by_id.get(replica_id)
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
            slot = self.pool.by_id.get(pending.pinned)
            if slot is None:
                pending.sink.fail(ReplicaUnavailableError(pending.pinned))
            else:
                if pending.message.model_id:
                    slot.reserve(pending.message.model_id)  # as sending it first did
                slot.link.start(pending)

    # -- choosing (policy/dispatch.py decides; the choice itself is policy/*routing.py) -

    def _drain(self) -> None:
        with self.lock:
            if self._queue:
                self._drain_locked()

    def _drain_locked(self) -> None:
        """(The lock held, the queue not empty: an answer's way, every queued request's.)"""
        self._drain_times = None
        self._queue = drain(self._queue, _model_of, _cancelled, self._choose, self._go)

    def _choose(self, pending: Pending, fallback: bool | None = None) -> int:
        """The routable replica's index for `pending`, or NO_REPLICA: by its model
        (policy/model_routing.py), on the engines' queues with affinity once a replica
        reports them or by the prefix held for an OpenAI prompt (router/engine_choice.py),
        else power of two choices on in-flight counts. `fallback`: a model request that
        waited long enough may go anywhere; None (a drain's choice): once it waited the
        matching timeout (read once a drain, and only if a model request is seen). A
        request's prompt is read as it starts (`_start`), by the set's prefix routing then."""
        model = pending.message.model_id
        if not (model or pending.prefix or self._by_engine):  # (most choices: first)
            pool = self.pool
            return choose_replica(pool.loads, self._max_ongoing, self._rng, pool.local)
        if model:
            if fallback is None:
                times = self._drain_times
                if times is None:
                    times = self._drain_times = (self._now(), self._matching_timeout())
                fallback = times[0] - pending.queued_at >= times[1]
            return self._choose_for_model(model, fallback)
        # an engine's queue, or a prompt: its prefix, from the deployment's 1st request
        return choose_by_engine(self.pool, self._max_ongoing, self._rng, pending, self._now(),
                                self._prefix_routing)

    def _on_prefix(self, link: ReplicaLink, change: PrefixHeld) -> None:
        """The replica's engine cached or evicted prompts (its KV events): the index
        follows what the engine holds, whichever router sent them. Not a replica that
        left the set: its link still delivers frames while its last answers drain, and
        a bit given it then would never be freed (it was dropped when it left)."""
        if link.replica_id not in self.pool.by_id:
            return
        self.pool.prefixes.follow(link.replica_id, change.stored, change.removed,
                                  change.cleared)

    def _on_stats(self, link: ReplicaLink) -> None:
        self._by_engine = True
        if self._queue:  # an engine other routers filled may have room again
            self._drain()

    # -- multiplexed models (policy/model_routing.py) ----------------------------------

    def _matching_timeout(self) -> float:
        return model_settings(self.pool.model_frames(), len(self.pool))[1]

    def _choose_for_model(self, model: str, fallback: bool) -> int:
        slots = self.pool.routable
        if not slots:
            return NO_REPLICA
        max_copies, _ = model_settings(self.pool.model_frames(), len(slots))
        now = self._now()
        return choose_for_model(self.pool.loads, self._max_ongoing,
                                [slot.holds(model) for slot in slots],
                                [slot.models_held() for slot in slots], max_copies,
                                self._rng, fallback,
                                [slot.coldest(self._heat, now) for slot in slots])

    def _matching_timed_out(self) -> None:
        with self.lock:
            self._matching_timer = None
            self._drain()
            due = next_matching_due(
                (p.queued_at for p in itertools.islice(self._queue, MODEL_SCAN_LIMIT)
                 if p.message.model_id), self._matching_timeout(), self._now())
            if due is not None:
                self._matching_timer = self._loop.call_later(due, self._matching_timed_out)

    def _on_models(self, link: ReplicaLink) -> None:
        if link.models is not None and link.models.lora_base:
            self.lora_base = link.models.lora_base
        if self._queue:
            self._drain()  # a replica took a model on: requests waiting for it may go

    # -- answers -----------------------------------------------------------------------

    def _on_final(self, link: ReplicaLink, pending: Pending, message: Message) -> None:
        # (the link calls these two with the lock held; this one on an own link's thread
        # too, where the loop's own calls must be handed to the loop)
        slot = self.pool.by_id.get(link.replica_id)
        model = pending.message.model_id
        if model and slot is not None:
            slot.release(model)
        status = message.status if isinstance(message, HttpStart) else None
        if isinstance(message, Rejected):
            self._rejected(slot, pending)
        elif status == 429 and self._retry_shed(pending, message):
            self._rejected(slot, pending)  # its engine is behind: once on another replica
        else:  # done (policy/dispatch.Answer): its replica has room again
            if slot is not None:
                slot.saturated = False
            if served(status):
                self.completed += 1
                self._service_s = smoothed(self._service_s, self._now() - pending.sent_at)
            if not pending.cancelled:
                pending.sink.deliver(message)
        if slot is None and not link.in_flight:
            self.pool.retire(link)
        elif link.owner is not None and not link.in_flight and not link.lent:
            link.lend()  # reclaimed, and all answered: its thread may read it again
        if self._queue:
            self._drain_locked()

    def _retry_shed(self, pending: Pending, message: Message) -> bool:
        assert isinstance(message, HttpStart)
        request = pending.message
        resendable = (isinstance(request, HttpRequest) and not request.more_body
                      and not pending.pinned and not pending.cancelled)
        if not retry_shed(message.status, message.headers, pending.shed, resendable,
                          len(self.pool.routable)):
            return False
        pending.shed = True  # a second replica's shed reaches the caller
        return True

    def _rejected(self, slot: Slot | None, pending: Pending) -> None:
        pending.link = None
        todo = after_rejection(slot is not None, slot is not None and slot.saturated,
                               bool(pending.pinned), pending.cancelled)
        if todo.saturate:
            assert slot is not None
            slot.saturated = True
            self._on_loop(self._loop.call_later, SATURATION_HOLD_S, self._unsaturate, slot)
        if todo.resend_later:  # into a reservation: that replica or none
            self._on_loop(self._loop.call_later, SATURATION_HOLD_S, self._resend, pending)
        if todo.requeue:
            self._queue.appendleft(pending)

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
        if self.pool.lost(link):
            level = logging.DEBUG if self.closing else logging.WARNING
            log.log(level, "lost connection to replica %s of %s", link.replica_id,
                    self.deployment)
        self._loop.call_soon(self._drain)

    def load_report(self, urgent: bool = False) -> LoadReport | None:
        """What changed since the last report, or None when nothing did. `urgent`: a
        report sent early (a queue started to grow, arrivals jumped), not the regular one."""
        with self.lock:
            jump_rate = self._watch.jump_rate if urgent else 0.0
            if self._by_engine:
                self._report_watch(not urgent)
            now = (self.arrived, self.completed, self.rejected, len(self._queue),
                   self.in_flight)
            last = self._reported
            if now == last:
                return None
            self._reported = now
            at, since = self._now(), self._reported_at
            self._reported_at = at
        return LoadReport(self.deployment, now[0] - last[0], now[1] - last[1],
                          now[2] - last[2], now[3], now[4], measured_at=at, covers_s=at - since,
                          jump_rate=jump_rate)

    def _count_arrival(self, pending: Pending) -> bool:
        """Count a request that arrived (and its model's heat); whether its deployment's
        arrivals just jumped and the autoscaler should hear of it now (caller holds the
        lock)."""
        self.arrived += 1
        model = pending.message.model_id
        if not (model or self._by_engine):
            return False  # (most requests: no clock read)
        now = self._now()
        if model:
            self._heat.hit(model, now)
        return self._by_engine and self._watch.arrived(now)

    def _report_watch(self, rearm: bool) -> None:
        """The arrival watch's recent rate takes in the arrivals since its last report."""
        arrived, at = self._watched
        now = self._now()
        self._watch.reported(self.arrived - arrived, now - at, rearm)
        self._watched = (self.arrived, now)

    def close(self) -> None:
        with self.lock:
            if self._matching_timer is not None:
                self._matching_timer.cancel()
                self._matching_timer = None
            self.pool.close()
