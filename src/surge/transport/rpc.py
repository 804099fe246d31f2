"""Request/reply and push messages over a framed connection (the control path).

Both ends are symmetric: each may call methods on the other (`await peer.call(...)`)
and push topics. Arguments and results travel cloudpickled; the control path carries
configs and user code, never request bodies.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import secrets
from collections.abc import Iterable
from typing import Any, Protocol

import cloudpickle

from surge.control_auth import TOKEN_ENV, find_token, token_path
from surge.errors import ControlAuthError, ControllerUnavailableError
from surge.transport.connection import FramedProtocol
from surge.transport.gate import HandshakeGate
from surge.transport.handshake import (
    NONCE_BYTES,
    ClientHandshake,
    HandshakeFailed,
    ServerHandshake,
    ServerUnproven,
)
from surge.transport.messages import Message, Push, Reply, Rpc

__all__ = ["HANDSHAKE_TIMEOUT_S", "RpcHandler", "RpcPeer", "broadcast", "connect_rpc",
           "split_address"]

# How long a client waits for the controller's side of the handshake once connected: a
# controller busy with a herd lets handshakes in a few at a time (transport/gate.py),
# and a member that gave up early would exit (and be restarted into the same herd).
HANDSHAKE_TIMEOUT_S = 30.0


class RpcHandler(Protocol):
    """(A handler may also name `memo_topics`: pushes of those topics that repeat the
    previous one's bytes are delivered as the previous value, not unpickled again; only
    for handlers that never change a pushed value.)"""

    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any: ...

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None: ...

    def on_disconnect(self, peer: RpcPeer) -> None: ...


class _Impostor(ControlAuthError):
    """The listener at the control address does not know the token."""


class RemoteError(Exception):
    """An RPC raised an exception that did not pickle."""


class RpcPeer(FramedProtocol):
    """One end of a control connection. With `token`, this is the accepting end of a
    guarded link: the other end must complete the handshake (transport/handshake.py)
    before anything it sends is unpickled; `authenticate` is the connecting end's."""

    def __init__(self, handler: RpcHandler | None, token: str | None = None,
                 gate: HandshakeGate | None = None) -> None:
        super().__init__()
        self.handler = handler
        self._handshake_gate = gate
        self._server = ServerHandshake(token, secrets.token_bytes(NONCE_BYTES)) \
            if token else None
        self._client: ClientHandshake | None = None
        self._proved: asyncio.Future[None] | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.info: dict[str, Any] = {}  # what the other side told us about itself
        self._memo_topics: frozenset[str] = getattr(handler, "memo_topics", frozenset())
        self._memo: dict[str, tuple[bytes, Any]] = {}  # topic -> the last payload, value
        self.connected = asyncio.Event()
        self.disconnected = asyncio.Event()

    @property
    def authenticated(self) -> bool:
        """Whether the other end may be trusted (it proved it knows our token)."""
        return self._server is None or self._server.done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._server is not None:
            self.expect_token(self._handshake_gate)
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

    def push_payload(self, topic: str, payload: bytes) -> None:
        """Push a value pickled already (`broadcast`: one pickle for many peers)."""
        self.send(Push(topic=topic, payload=payload))

    async def authenticate(self, token: str, timeout: float | None = None) -> None:
        """Prove we know the token once the other end has proved it does; nothing it
        sends is unpickled before that."""
        self._client = ClientHandshake(token, secrets.token_bytes(NONCE_BYTES))
        self._proved = self._loop.create_future()
        self.send(self._client.start())
        try:
            await asyncio.wait_for(asyncio.shield(self._proved), timeout)
        finally:
            if not self._proved.done():
                self._proved.cancel()

    def _client_step(self, message: Message) -> None:
        assert self._client is not None and self._proved is not None
        if self._proved.done():
            return
        try:
            for frame in self._client.receive(message):
                self.send(frame)
        except ServerUnproven as exc:
            self._proved.set_exception(_Impostor(str(exc)))
            return
        except HandshakeFailed as exc:
            self._proved.set_exception(ControlAuthError(str(exc)))
            return
        if self._client.done:
            self._proved.set_result(None)

    def _server_step(self, message: Message) -> None:
        assert self._server is not None
        if self.transport is None or self.transport.is_closing():
            return  # refused already: ignore the rest of what it sent
        try:
            for frame in self._server.receive(message):
                self.send(frame)
        except HandshakeFailed:
            if isinstance(message, Rpc):  # a client without a token: say what it lacks
                refusal = ControlAuthError(
                    "this surge instance requires its control token: set "
                    f"{TOKEN_ENV} (the process that started it publishes it for its "
                    "user; see SECURITY.md)")
                self.send(Reply(id=message.id, ok=False, payload=cloudpickle.dumps(refusal)))
            self.close()
            return
        if self._server.done:
            self.token_accepted()

    def message_received(self, message: Message) -> None:
        if not self.authenticated:
            self._server_step(message)
        elif self._client is not None and not self._client.done:
            self._client_step(message)
        elif isinstance(message, Reply):
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
            self.handler.on_push(self, message.topic, self._value(message))

    def _value(self, message: Push) -> Any:
        if message.topic not in self._memo_topics:
            return pickle.loads(message.payload)
        last = self._memo.get(message.topic)
        if last is not None and last[0] == message.payload:  # an idle member's report
            return last[1]
        value = pickle.loads(message.payload)
        self._memo[message.topic] = (message.payload, value)
        return value

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
        self.disconnected.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("connection closed during the call"))
        self._waiting.clear()
        if self._proved is not None and not self._proved.done():
            self._proved.set_exception(ConnectionError("connection closed during the "
                                                       "handshake"))
        if self.handler is not None:
            self.handler.on_disconnect(self)


def broadcast(peers: Iterable[Any], topic: str, value: Any) -> int:
    """Push `value` to every peer, pickled once (with the C pickler: for surge's own
    value types, never user code); peers that are not RpcPeers (tests' fakes) get the
    value itself. Returns the payload's size (0 if no peer needed it)."""
    payload = b""
    for peer in peers:
        if isinstance(peer, RpcPeer):
            if not payload:
                payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            peer.push_payload(topic, payload)
        else:
            peer.push(topic, value)
    return len(payload)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


async def connect_rpc(address: str, handler: RpcHandler | None,
                      timeout: float = 5.0, token: str | None = None,
                      peer_class: type[RpcPeer] = RpcPeer,
                      handshake_timeout: float | None = None) -> RpcPeer:
    """Connect (within `timeout`) and authenticate (with `token`, else the one
    `find_token` finds; within `handshake_timeout`, by default the longer of `timeout`
    and HANDSHAKE_TIMEOUT_S: the controller may let it in only after others)."""
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, peer = await asyncio.wait_for(
            loop.create_connection(lambda: peer_class(handler), host, port), timeout)
    except (TimeoutError, OSError) as exc:
        raise ControllerUnavailableError(
            f"no surge instance answers at {address} ({exc}); start one with serve.start() "
            "or `surge run`, or point SURGE_ADDRESS at a running one") from None
    token = token or find_token(address)
    if token:
        try:
            await peer.authenticate(token, handshake_timeout if handshake_timeout is not None
                                    else max(timeout, HANDSHAKE_TIMEOUT_S))
        except _Impostor:
            peer.close()
            raise ControlAuthError(
                f"the process listening at {address} could not prove that it knows this "
                f"process's control token: either the token is stale (set {TOKEN_ENV} to the "
                f"instance's token; its starter wrote it to {token_path(address)}) or another "
                "program holds the port; the token itself was not sent") from None
        except ControlAuthError:
            peer.close()
            raise ControlAuthError(
                f"the surge instance at {address} refused this process's control token; set "
                f"{TOKEN_ENV} to its token (its starter wrote it to {token_path(address)})"
            ) from None
        except (TimeoutError, ConnectionError) as exc:
            peer.close()
            raise ControllerUnavailableError(
                f"the surge instance at {address} did not accept the connection ({exc!r})"
            ) from None
    return peer
