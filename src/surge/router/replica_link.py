"""One persistent, multiplexed connection from a router to one replica.

A link to a replica on another node (TCP) opens with the instance's handshake
(transport/handshake.py): the replica proves it knows the token before the router sends
it anything that matters, then the router proves it; `trusted` resolves then (at once
for a Unix socket, private to the user).

The link shares its router's lock (transport/threadsafe.py): a caller's thread may
start a request on it (`Router.try_submit`) while the loop reads its answers. A link
with an `owner` is that thread's own: only it starts requests there, and it reads the
answers itself while the loop lends it the reading (router.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import secrets
import threading
import time
from collections.abc import Callable
from typing import Protocol, cast

from surge.errors import ReplicaDiedError
from surge.transport.flow import Credits
from surge.transport.handshake import NONCE_BYTES, ClientHandshake, HandshakeFailed
from surge.transport.messages import (
    Call,
    Credit,
    End,
    Failure,
    GrpcEnd,
    GrpcRequest,
    HttpBody,
    HttpRequest,
    HttpStart,
    Item,
    Message,
    Models,
    PrefixHeld,
    Pull,
    Rejected,
    Result,
    RoutingStats,
    WsClose,
    WsData,
)
from surge.transport.threadsafe import ThreadSafeProtocol

__all__ = ["Pending", "ReplicaLink", "Reservation", "Sink"]


class Sink(Protocol):
    """Where a request's response goes: frames as they come, or one failure."""

    def deliver(self, message: Message) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class Pending:
    """A request on its way: queued in a router, or in flight on a replica.

    A streamed response is flow-controlled (transport/flow.py): the sink calls
    `consumed(n)` as it passes n payload bytes on, and the replica may send that much more.
    """

    __slots__ = ("cancelled", "credits", "link", "message", "pinned", "prefix", "queued_at",
                 "sent_at", "shed", "sink")

    # A Reservation: a slot held, nothing sent (a class attribute: every request's start
    # reads it, cheaper than an isinstance call)
    reserves = False

    def __init__(self, message: HttpRequest | Call | GrpcRequest, sink: Sink) -> None:
        self.message = message
        self.sink = sink
        self.link: ReplicaLink | None = None
        self.cancelled = False
        self.credits: Credits | None = None  # made with the stream's first frame
        self.queued_at = 0.0  # when the router queued it (monotonic), for the matching timeout
        self.sent_at = 0.0  # when the router sent it to a replica: its service time's start
        # The replica it must go to (a dispatch into a reservation): never another one.
        self.pinned = ""
        # Its prompt's chunk names (policy/prefix_index.py), read as it starts (Router._start).
        self.prefix: list[int] | None = None
        self.shed = False  # a replica shed it once (policy/dispatch.retry_shed)

    def consumed(self, nbytes: int) -> None:
        """The sink has passed nbytes of this response's body on (written them to its
        client): the replica may send that many more."""
        if self.credits is not None:
            self._return(self.credits.consumed(nbytes))

    def delivered(self, nbytes: int) -> None:
        """A stream frame of nbytes is about to reach the sink."""
        if self.credits is None:
            self.credits = Credits()
        self._return(self.credits.delivered(nbytes))

    def _return(self, amount: int) -> None:
        link = self.link
        if amount and link is not None and not self.cancelled:
            link.send(Credit(id=self.message.id, amount=amount))


class Reservation(Pending):
    """A slot held on a replica for a request still to come (`handle.choose_replica`).

    The router routes, queues or refuses it as it would the request, and the link counts
    it in flight like one, but nothing is sent: `granted` resolves to the link once the
    slot is held, and the router's `dispatch` sends the request in its place (or
    `release` frees it). It is its own sink: no answer ever comes for it."""

    __slots__ = ("granted",)
    reserves = True

    def __init__(self, message: Call) -> None:
        super().__init__(message, self)
        self.granted: concurrent.futures.Future[ReplicaLink] = concurrent.futures.Future()

    def deliver(self, message: Message) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.granted.set_exception(exc)

    def hold(self, link: ReplicaLink) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.granted.set_result(link)  # (any thread: a concurrent future)


# Tuples made once: `A | B` in an isinstance call builds a Union at every call, and every
# answer asks.
_HTTP_FRAMES = (HttpStart, HttpBody)
_ENDS = (Result, End, GrpcEnd, Failure, Rejected, WsClose)


def stream_bytes(message: Message) -> int:
    """The payload of a non-final stream frame (what flow control charges for)."""
    if isinstance(message, _HTTP_FRAMES):
        return len(message.body)
    if isinstance(message, Item):
        return len(message.payload)
    if isinstance(message, WsData):
        return len(message.data)
    return 0


def is_final(message: Message) -> bool:
    if isinstance(message, _HTTP_FRAMES):
        return not message.more
    return isinstance(message, _ENDS)


class ReplicaLink(ThreadSafeProtocol):
    """Sends requests to one replica and hands each response frame to its request's sink."""

    def __init__(self, replica_id: str, on_final: Callable[[ReplicaLink, Pending, Message], None],
                 on_lost: Callable[[ReplicaLink], None],
                 on_models: Callable[[ReplicaLink], None] | None = None,
                 lock: threading.RLock | None = None, *, owner: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(lock)
        self.replica_id = replica_id
        self.owner = owner  # the thread whose own link this is (None: the router's)
        # The models the replica holds or loads (its last Models frame) and its affinity
        # settings; None until a multiplexed replica says (routing reads the router's
        # shared link's; an own link's are not looked at).
        self.models: Models | None = None
        self.model_set: frozenset[str] = frozenset()
        self._on_models = on_models
        # The replica's last RoutingStats (its engine's queue), when it came (on `clock`,
        # the router's), and how many of this link's requests were in flight then.
        self._clock = clock
        self.stats: RoutingStats | None = None
        self.stats_at = 0.0
        self.in_flight_at_stats = 0
        self.on_stats: Callable[[ReplicaLink], None] | None = None
        # What the replica's engine cached and evicted (PrefixHeld), for the pool's index.
        self.on_prefix: Callable[[ReplicaLink, PrefixHeld], None] | None = None
        self.in_flight: dict[int, Pending] = {}
        self._ids = itertools.count(1)
        self._on_final = on_final
        self._on_lost = on_lost
        self._handshake: ClientHandshake | None = None
        self.trusted: asyncio.Future[None] = self._loop.create_future()

    def require_handshake(self, token: str) -> None:
        """Before connecting: the link is trusted only once the handshake is done."""
        self._handshake = ClientHandshake(token, secrets.token_bytes(NONCE_BYTES))

    def _untrusted(self, exc: Exception) -> None:
        if not self.trusted.done():
            self.trusted.set_exception(exc)
            self.trusted.exception()  # whoever awaits it sees it; nobody may

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._handshake is not None:
            self.send(self._handshake.start())
        else:
            self.trusted.set_result(None)

    def _handshake_step(self, handshake: ClientHandshake, message: Message) -> None:
        try:
            for frame in handshake.receive(message):
                self.send(frame)
        except HandshakeFailed as exc:
            self._untrusted(exc)
            self.close()
            return
        if handshake.done and not self.trusted.done():
            self.trusted.set_result(None)

    def start(self, pending: Pending) -> None:
        """Send a request (any thread, with the lock held); its service time starts."""
        pending.sent_at = self._clock()
        request_id = next(self._ids)
        pending.message.id = request_id
        pending.link = self
        self.in_flight[request_id] = pending
        if pending.reserves:  # counted in flight; the request comes with `dispatch`
            cast(Reservation, pending).hold(self)
            return
        self.send(pending.message)

    def data_received(self, data: bytes) -> None:
        with self.lock:
            super().data_received(data)

    def message_received(self, message: Message) -> None:
        if self._handshake is not None and not self._handshake.done:
            self._handshake_step(self._handshake, message)
            return
        pending = self.in_flight.get(message.id)  # type: ignore[union-attr]
        if pending is None:
            if isinstance(message, Models):  # id 0: no request's
                self.models, self.model_set = message, frozenset(message.ids)
                if self._on_models is not None:
                    self._on_models(self)
            elif isinstance(message, RoutingStats):
                self.stats, self.stats_at = message, self._clock()
                self.in_flight_at_stats = len(self.in_flight)
                if self.on_stats is not None:
                    self.on_stats(self)
            elif isinstance(message, PrefixHeld):
                if self.on_prefix is not None:
                    self.on_prefix(self, message)
            return
        if is_final(message):
            del self.in_flight[message.id]  # type: ignore[union-attr]
            self._on_final(self, pending, message)
        elif isinstance(message, Pull):  # the replica asks for its client stream
            if not pending.cancelled:
                pending.sink.deliver(message)
        elif not pending.cancelled:
            if type(message) is not Credit:  # credit for the request's own stream: no charge
                pending.delivered(stream_bytes(message))
            pending.sink.deliver(message)

    def closed(self, exc: Exception | None) -> None:  # with the lock held
        self._untrusted(ConnectionError("the replica closed the link"))
        lost = list(self.in_flight.values())
        self.in_flight.clear()
        self._on_lost(self)
        for pending in lost:
            if not pending.cancelled:
                pending.sink.fail(ReplicaDiedError(
                    f"replica {self.replica_id} died while handling the request"))
