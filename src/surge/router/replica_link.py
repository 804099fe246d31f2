"""One persistent, multiplexed connection from a router to one replica."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Protocol

from surge.errors import ReplicaDiedError
from surge.transport.connection import FramedProtocol
from surge.transport.messages import (
    Call,
    End,
    Failure,
    HttpBody,
    HttpRequest,
    HttpStart,
    Message,
    Rejected,
    Result,
)

__all__ = ["Pending", "ReplicaLink", "Sink"]


class Sink(Protocol):
    """Where a request's response goes: frames as they come, or one failure."""

    def deliver(self, message: Message) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class Pending:
    """A request on its way: queued in a router, or in flight on a replica."""

    __slots__ = ("cancelled", "link", "message", "sink")

    def __init__(self, message: HttpRequest | Call, sink: Sink) -> None:
        self.message = message
        self.sink = sink
        self.link: ReplicaLink | None = None
        self.cancelled = False


def is_final(message: Message) -> bool:
    if isinstance(message, HttpStart | HttpBody):
        return not message.more
    return isinstance(message, Result | End | Failure | Rejected)


class ReplicaLink(FramedProtocol):
    """Sends requests to one replica and hands each response frame to its request's sink."""

    def __init__(self, replica_id: str, on_final: Callable[[ReplicaLink, Pending, Message], None],
                 on_lost: Callable[[ReplicaLink], None]) -> None:
        super().__init__()
        self.replica_id = replica_id
        self.in_flight: dict[int, Pending] = {}
        self._ids = itertools.count(1)
        self._on_final = on_final
        self._on_lost = on_lost
        self.ready = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.ready.set()

    def start(self, pending: Pending) -> None:
        request_id = next(self._ids)
        pending.message.id = request_id
        pending.link = self
        self.in_flight[request_id] = pending
        self.send(pending.message)

    def message_received(self, message: Message) -> None:
        pending = self.in_flight.get(message.id)  # type: ignore[union-attr]
        if pending is None:
            return
        if is_final(message):
            del self.in_flight[message.id]  # type: ignore[union-attr]
            self._on_final(self, pending, message)
        elif not pending.cancelled:
            pending.sink.deliver(message)

    def closed(self, exc: Exception | None) -> None:
        lost = list(self.in_flight.values())
        self.in_flight.clear()
        self._on_lost(self)
        for pending in lost:
            if not pending.cancelled:
                pending.sink.fail(ReplicaDiedError(
                    f"replica {self.replica_id} died while handling the request"))
