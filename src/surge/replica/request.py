"""One request's state at the replica, from admission until it is answered.

A connection (replica/connection.py) keeps one `Request` per request id it admitted; the
frames that follow the request (credit, its own stream's parts, a cancel) find it there,
and it leaves when the request ends: its task finished, or its worker answered a sync
call (sync_calls.py), or the call was cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Any

from surge.replica.streams import Inbox
from surge.replica.sync_calls import Baton
from surge.router.children import ChildCalls
from surge.transport.flow import SendWindow

__all__ = ["Request"]


class Request:
    __slots__ = ("baton", "children", "disconnected", "id", "inbox", "input", "route",
                 "started", "task", "waiter", "window")

    def __init__(self, request_id: int, route: str, started: float) -> None:
        self.id = request_id
        self.route = route  # the method or route prefix its latency is recorded under
        self.started = started  # the server's clock, at admission
        self.task: asyncio.Task[bool] | None = None  # running on the loop
        # Running on the pool (a plain method's handle call): whoever takes the baton
        # first answers it, its worker or a cancel; guarded by the connection's lock.
        self.baton: Baton | None = None
        # The handle calls it made, cancelled with it (router/children.py); None once
        # cancelled or left to go on.
        self.children: ChildCalls | None = None
        self.disconnected: asyncio.Event | None = None  # an HTTP request's client left
        # Its response stream's flow control (transport/flow.py): what it may still send,
        # and the sender waiting for credit, if any.
        self.window: SendWindow | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.input: Any = None  # a gRPC client stream (gRPCInputStream)
        self.inbox: Inbox | None = None  # its own stream (streams.py)

    def __repr__(self) -> str:
        where = "task" if self.task is not None else "pool" if self.baton else "idle"
        return f"<Request {self.id} {self.route} {where}>"

    def credit(self, amount: int) -> None:
        """The router returned `amount` of the window: wake the sender if it may go on."""
        window = self.window
        if window is not None:
            window.credit(amount)
            if window.open:
                self.wake()

    def wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
