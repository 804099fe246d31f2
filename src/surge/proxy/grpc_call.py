"""One gRPC call's state in the proxy (`GrpcCall`): what its stream brought, where it
went, what it still owes its client and its replica. proxy/grpc_core.py decides on it;
the shell (proxy/grpc_connection.py) keeps its I/O handles here (`timer`, `task`,
`router`) and hears its router's frames through it (`sink`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Protocol

from surge.codecs.grpc_wire import MessageReader, Metadata
from surge.errors import RequestCancelledError
from surge.router.replica_link import Pending
from surge.transport.grpc_methods import GrpcMethod, unpack_metadata
from surge.transport.messages import Failure, Message

if TYPE_CHECKING:
    from surge.model import RouteTarget
    from surge.router.router import Router

__all__ = ["MAX_MESSAGE_BYTES", "CallSink", "GrpcCall", "call_trailers", "failure_of"]

# Ray Serve's message size limit, both ways: 2 GiB - 1 (grpc's own default is 4 MiB in).
MAX_MESSAGE_BYTES = 2**31 - 1
_DONE = MessageReader(0)  # an ended call's (it reads nothing more), for its parts to go


class CallSink(Protocol):
    """Where a call's router frames go: its connection's shell."""

    def delivered(self, call: GrpcCall, message: Message) -> None: ...

    def failed(self, call: GrpcCall, exc: BaseException) -> None: ...


class GrpcCall:
    """One RPC: what its stream carried so far, and the router's sink for it."""

    __slots__ = ("body", "client_done", "end_sent", "ended", "headers_sent", "inbox",
                 "inbox_bytes", "labels", "local", "metadata", "method", "pending", "pulls",
                 "questions", "reader", "request_id", "router", "sink", "started", "stream_id",
                 "submitted", "target", "task", "timer", "unacked", "unreturned", "watching")

    def __init__(self, sink: CallSink, stream_id: int, started: float) -> None:
        self.sink = sink
        self.stream_id = stream_id
        self.started = started
        self.request_id = ""
        self.metadata: Metadata = ()
        self.labels: tuple[str, str, str] | None = None  # counted under these when it ends
        self.method: GrpcMethod | None = None
        self.target: RouteTarget | None = None
        self.local = ""  # the path of a local service's method
        self.reader = MessageReader(MAX_MESSAGE_BYTES)
        self.body: bytes | None = None  # a unary request's message
        # A client stream: its messages not yet pulled, with their size on the wire,
        # and the stream's bytes not yet given back to the client's window (those of
        # the messages waiting here: the rest goes back as it arrives).
        self.inbox: deque[tuple[bytes, int]] = deque()
        self.inbox_bytes = 0
        self.unreturned = 0
        self.client_done = False  # the client's stream ended
        self.end_sent = False  # the replica was told so
        self.pulls = 0  # client stream messages the replica asked for, not yet sent
        self.pending: Pending | None = None
        self.router: Router | None = None
        self.submitted = False
        self.timer: asyncio.TimerHandle | None = None
        self.headers_sent = False
        self.unacked = 0  # response bytes written but not yet acknowledged to the replica
        self.ended = False
        # Reflection's requests not yet taken by its task (None: the end of its stream).
        self.questions: deque[bytes | None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.watching = False  # a Health/Watch stream told SERVING: NOT_SERVING follows

    def __repr__(self) -> str:
        path = self.method.path if self.method is not None else self.local
        return f"<GrpcCall {self.stream_id} {path} ended={self.ended}>"

    @property
    def streamed(self) -> bool:
        """The client streams its messages (a streaming method, or reflection)."""
        if self.method is not None:
            return self.method.request_streaming
        return self.questions is not None

    def deliver(self, message: Message) -> None:
        self.sink.delivered(self, message)

    def fail(self, exc: BaseException) -> None:
        self.sink.failed(self, exc)

    def release(self) -> None:
        """The call ended: its messages go now, not with a collection of the cycle it
        makes with its Pending (a 10 MB request would wait for the garbage collector)."""
        self.pending = self.router = self.body = None
        self.inbox.clear()
        if self.reader.partial:
            self.reader = _DONE


def call_trailers(request_id: str, packed: list[tuple[str, str]]) -> Metadata:
    """`request_id` first, then the user's trailers (a user's own request_id wins)."""
    user = unpack_metadata(packed)
    if any(key == "request_id" for key, _ in user):
        return user
    return (("request_id", request_id), *user)


def failure_of(message: Failure) -> BaseException:
    if message.kind == "cancelled":
        return RequestCancelledError(message.message)
    return RuntimeError(message.message)
