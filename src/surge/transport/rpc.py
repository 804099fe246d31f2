"""Request/reply and push messages over a framed connection (the control path).

Both ends are symmetric: each may call methods on the other (`await peer.call(...)`)
and push topics. Arguments and results travel cloudpickled; the control path carries
configs and user code, never request bodies.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
from typing import Any, Protocol

import cloudpickle

from surge.errors import ControllerUnavailableError
from surge.transport.connection import FramedProtocol
from surge.transport.messages import Message, Push, Reply, Rpc

__all__ = ["RpcHandler", "RpcPeer", "connect_rpc"]


class RpcHandler(Protocol):
    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any: ...

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None: ...

    def on_disconnect(self, peer: RpcPeer) -> None: ...


class RemoteError(Exception):
    """An RPC raised an exception that did not pickle."""


class RpcPeer(FramedProtocol):
    def __init__(self, handler: RpcHandler | None) -> None:
        super().__init__()
        self.handler = handler
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.info: dict[str, Any] = {}  # what the other side told us about itself
        self.connected = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.connected.set()

    async def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> Any:
        if self.is_closed:
            raise ConnectionError(f"connection closed before calling {method}")
        call_id = next(self._ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._waiting[call_id] = future
        self.send(Rpc(id=call_id, method=method, payload=cloudpickle.dumps(kwargs)))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(call_id, None)

    def push(self, topic: str, value: Any) -> None:
        self.send(Push(topic=topic, payload=cloudpickle.dumps(value)))

    def message_received(self, message: Message) -> None:
        if isinstance(message, Reply):
            future = self._waiting.get(message.id)
            if future is not None and not future.done():
                value = pickle.loads(message.payload)
                if message.ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        elif isinstance(message, Rpc):
            self._loop.create_task(self._serve(message))
        elif isinstance(message, Push) and self.handler is not None:
            self.handler.on_push(self, message.topic, pickle.loads(message.payload))

    async def _serve(self, message: Rpc) -> None:
        try:
            if self.handler is None:
                raise RuntimeError("this end serves no RPCs")
            result = await self.handler.handle_rpc(self, message.method,
                                                   pickle.loads(message.payload))
            payload, ok = cloudpickle.dumps(result), True
        except Exception as exc:
            ok = False
            try:
                payload = cloudpickle.dumps(exc)
            except Exception:
                payload = cloudpickle.dumps(RemoteError(f"{type(exc).__name__}: {exc}"))
        self.send(Reply(id=message.id, ok=ok, payload=payload))

    def closed(self, exc: Exception | None) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("connection closed during the call"))
        self._waiting.clear()
        if self.handler is not None:
            self.handler.on_disconnect(self)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


async def connect_rpc(address: str, handler: RpcHandler | None,
                      timeout: float = 5.0) -> RpcPeer:
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, peer = await asyncio.wait_for(
            loop.create_connection(lambda: RpcPeer(handler), host, port), timeout)
    except (TimeoutError, OSError) as exc:
        raise ControllerUnavailableError(
            f"no surge instance answers at {address} ({exc}); start one with serve.start() "
            "or `surge run`, or point SURGE_ADDRESS at a running one") from None
    return peer
