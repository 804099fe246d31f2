"""Request/reply and push messages over a framed connection (the control path).

Both ends are symmetric: each may call methods on the other (`await peer.call(...)`)
and push topics. Arguments and results travel cloudpickled; the control path carries
configs and user code, never request bodies.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import pickle
import secrets
from typing import Any, Protocol

import cloudpickle

from surge.control_auth import TOKEN_ENV, find_token, token_path
from surge.errors import ControlAuthError, ControllerUnavailableError
from surge.transport.connection import FramedProtocol
from surge.transport.messages import Message, Push, Reply, Rpc

__all__ = ["AUTHENTICATE", "RpcHandler", "RpcPeer", "connect_rpc"]

# A connection to a peer that requires a token opens with CHALLENGE (the client's nonce;
# the answer: the server's nonce + its proof) and AUTHENTICATE (the client's proof).
# Payloads are raw bytes, never pickles; the token itself never travels. Replicas on
# TCP take AUTHENTICATE with the raw token as their first frame instead.
AUTHENTICATE = "authenticate"
CHALLENGE = "challenge"
NONCE_BYTES = 16


def _proof(key: bytes, role: bytes, nonce: bytes, other: bytes) -> bytes:
    return hmac.new(key, role + nonce + other, hashlib.sha256).digest()


class RpcHandler(Protocol):
    async def handle_rpc(self, peer: RpcPeer, method: str, kwargs: dict[str, Any]) -> Any: ...

    def on_push(self, peer: RpcPeer, topic: str, value: Any) -> None: ...

    def on_disconnect(self, peer: RpcPeer) -> None: ...


class _Impostor(ControlAuthError):
    """The listener at the control address does not know the token."""


class RemoteError(Exception):
    """An RPC raised an exception that did not pickle."""


class RpcPeer(FramedProtocol):
    """One end of a control connection; with `token`, the other end must present it
    in its first frame, and nothing it sends is unpickled before that."""

    def __init__(self, handler: RpcHandler | None, token: str | None = None) -> None:
        super().__init__()
        self.handler = handler
        self._token = token.encode() if token else None
        self.authenticated = token is None  # the other end proved it knows our token
        self._trusted = True  # False while we prove ourselves and wait for its proof
        self._nonces: tuple[bytes, bytes] | None = None  # (client's, ours) once challenged
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.info: dict[str, Any] = {}  # what the other side told us about itself
        self.connected = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self.authenticated:
            self.expect_token()
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

    async def authenticate(self, token: str, timeout: float | None = None) -> None:
        """Mutual challenge-response: each end proves it knows the token without sending
        it, and nothing the other end sends is unpickled before it has proved itself."""
        key = token.encode()
        self._trusted = False
        mine = secrets.token_bytes(NONCE_BYTES)
        answer = await self._raw_call(CHALLENGE, mine, timeout)
        theirs, proof = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
        if not hmac.compare_digest(proof, _proof(key, b"server", mine, theirs)):
            raise _Impostor("the other end could not prove that it knows the token")
        await self._raw_call(AUTHENTICATE, _proof(key, b"client", theirs, mine), timeout)
        self._trusted = True

    async def _raw_call(self, method: str, payload: bytes, timeout: float | None) -> bytes:
        call_id = next(self._ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._waiting[call_id] = future
        self.send(Rpc(id=call_id, method=method, payload=payload))
        try:
            result: bytes = await asyncio.wait_for(future, timeout)
            return result
        finally:
            self._waiting.pop(call_id, None)

    def _untrusted_reply(self, message: Message) -> None:
        """Before the other end proved itself: raw answers to our two auth calls only."""
        if not isinstance(message, Reply):
            return
        future = self._waiting.get(message.id)
        if future is None or future.done():
            return
        if message.ok:
            future.set_result(message.payload)
        else:
            future.set_exception(ControlAuthError("the surge instance refused the token"))

    def _check_token(self, message: Message) -> None:
        assert self._token is not None
        if self.transport is None or self.transport.is_closing():
            return  # refused already: ignore the rest of what it sent
        if isinstance(message, Rpc) and message.method == CHALLENGE and \
                self._nonces is None and len(message.payload) == NONCE_BYTES:
            theirs, mine = message.payload, secrets.token_bytes(NONCE_BYTES)
            self._nonces = (theirs, mine)
            answer = mine + _proof(self._token, b"server", theirs, mine)
            self.send(Reply(id=message.id, ok=True, payload=answer))
            return
        if (isinstance(message, Rpc) and message.method == AUTHENTICATE
                and self._nonces is not None and hmac.compare_digest(
                    message.payload, _proof(self._token, b"client", *reversed(self._nonces)))):
            self.authenticated = True
            self.token_accepted()
            self.send(Reply(id=message.id, ok=True, payload=b""))
            return
        if isinstance(message, Rpc):
            refusal = ControlAuthError(
                "this surge instance requires its control token: set SURGE_CONTROL_TOKEN "
                "(the process that started it publishes it for its user; see SECURITY.md)")
            self.send(Reply(id=message.id, ok=False, payload=cloudpickle.dumps(refusal)))
        self.close()

    def message_received(self, message: Message) -> None:
        if not self.authenticated:
            self._check_token(message)
        elif not self._trusted:
            self._untrusted_reply(message)
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
                      timeout: float = 5.0, token: str | None = None) -> RpcPeer:
    """Connect and authenticate (with `token`, else the one `find_token` finds)."""
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, peer = await asyncio.wait_for(
            loop.create_connection(lambda: RpcPeer(handler), host, port), timeout)
    except (TimeoutError, OSError) as exc:
        raise ControllerUnavailableError(
            f"no surge instance answers at {address} ({exc}); start one with serve.start() "
            "or `surge run`, or point SURGE_ADDRESS at a running one") from None
    token = token or find_token(address)
    if token:
        try:
            await peer.authenticate(token, timeout)
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
