"""A replica as a router sees it: a real frame server on loopback, answering on cue.

`FakeReplica` listens on 127.0.0.1 (`start` gives the `ReplicaInfo` to put in a
`ReplicaSet`) and speaks the frame protocol: a `Call` is answered at once with a
`Result` of its name and payload (`b"<name>:<payload>"`), or held until `release`
(`hold=True`), or `Rejected` once `reject_above` calls are held; a `Cancel` ends a held
call with a `cancelled` Failure. `drop` closes every connection (the replica died).
An `HttpRequest` whose body came whole is answered at once by `http_answer` (200, the
name and the body, unless a subclass answers otherwise). It records what came (`calls`,
`rejected`, `cancels`, `held`), so a test of a router waits on state, not on time.
"""

from __future__ import annotations

import asyncio

from surge.model import DeploymentId, ReplicaInfo
from surge.transport.connection import FramedProtocol
from surge.transport.messages import (
    Call,
    Cancel,
    Failure,
    HttpRequest,
    HttpStart,
    Message,
    Rejected,
    Result,
)

__all__ = ["FakeReplica"]

DEPLOYMENT = DeploymentId("app", "d")  # the replicas' deployment unless told


class FakeReplica:
    """Serves frames: answer, hold until released, or reject above `reject_above` held."""

    def __init__(self, name: str, *, hold: bool = False, reject_above: int | None = None,
                 deployment: DeploymentId = DEPLOYMENT) -> None:
        self.name = name
        self.hold = hold
        self.reject_above = reject_above
        self.deployment = deployment
        self.calls: list[bytes] = []  # payloads, in arrival order (rejected ones too)
        self.rejected: list[bytes] = []
        self.cancels: list[int] = []
        self.held: list[tuple[FramedProtocol, Call]] = []
        self.connections: list[FramedProtocol] = []  # one per router link, in order
        self.server: asyncio.Server | None = None
        self._gone: list[asyncio.Future[None]] = []

    def __repr__(self) -> str:
        return (f"<FakeReplica {self.name} calls={len(self.calls)} held={len(self.held)} "
                f"connections={len(self.connections)}>")

    async def start(self) -> ReplicaInfo:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Connection(self), "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return ReplicaInfo(replica_id=self.name, deployment=self.deployment,
                           address=f"127.0.0.1:{port}", pid=0)

    def on_call(self, connection: FramedProtocol, call: Call) -> None:
        self.calls.append(call.payload)
        if self.reject_above is not None and len(self.held) >= self.reject_above:
            self.rejected.append(call.payload)
            connection.send(Rejected(id=call.id, ongoing=len(self.held)))
        elif self.hold:
            self.held.append((connection, call))
        else:
            connection.send(self.result(call))

    def on_http(self, connection: FramedProtocol, request: HttpRequest) -> None:
        self.calls.append(request.body)
        connection.send(self.http_answer(request))

    def http_answer(self, request: HttpRequest) -> Message:
        """The answer to a whole HTTP request (a subclass may refuse it)."""
        return HttpStart(id=request.id, status=200, headers=[],
                         body=self.name.encode() + b":" + request.body, more=False)

    def on_cancel(self, connection: FramedProtocol, cancel: Cancel) -> None:
        self.cancels.append(cancel.id)
        for entry in self.held:
            if entry[0] is connection and entry[1].id == cancel.id:
                self.held.remove(entry)
                connection.send(Failure(id=cancel.id, kind="cancelled", message="cancelled"))

    def result(self, call: Call) -> Message:
        """The answer to `call` (a subclass may answer otherwise: an HTTP refusal)."""
        return Result(id=call.id, payload=self.name.encode() + b":" + call.payload)

    def release(self, count: int | None = None) -> None:
        """Answer the first `count` held calls (all by default)."""
        count = len(self.held) if count is None else count
        for connection, call in self.held[:count]:
            connection.send(self.result(call))
        del self.held[:count]

    def drop(self) -> None:
        """The replica process dies: every connection closes."""
        for connection in self.connections:
            connection.close()

    async def close(self) -> None:
        """Stop listening and close every connection; returns once they are closed."""
        self.drop()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        await asyncio.gather(*self._gone)


class _Connection(FramedProtocol):
    def __init__(self, replica: FakeReplica) -> None:
        super().__init__()
        self.replica = replica
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.replica.connections.append(self)
        self.replica._gone.append(self.gone)

    def message_received(self, message: Message) -> None:
        if isinstance(message, Call):
            self.replica.on_call(self, message)
        elif isinstance(message, HttpRequest):
            self.replica.on_http(self, message)
        elif isinstance(message, Cancel):
            self.replica.on_cancel(self, message)

    def closed(self, exc: Exception | None) -> None:
        if not self.gone.done():
            self.gone.set_result(None)
