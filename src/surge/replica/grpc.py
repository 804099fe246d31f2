"""Serve one gRPC call in the replica: parse the request once, call the method named like
the RPC, send the response's bytes back with the call's status.

The request's (de)serializers come from the servicer function the proxy named in the
frame (transport/grpc_methods.py; imported once per replica). The method gets the parsed
request (or a `gRPCInputStream` for a client stream) and, when its signature has a
`grpc_context` parameter, the call's `RayServegRPCContext`, as in Ray Serve. Its return
value (or each item it yields, for a response stream) is serialized here: a message, or
bytes as they are. A method that raises ends the call with the code it set on its
context, else INTERNAL, with its details or the error's text.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from surge.errors import ConfigError
from surge.transport.grpc_methods import GrpcMethod, methods_of, pack_metadata
from surge.transport.messages import Failure, GrpcEnd, GrpcRequest, Item, Message, Pull

__all__ = ["GRPC_CONTEXT_ARG", "GrpcMethods", "serve_call"]

log = logging.getLogger("surge.replica")

GRPC_CONTEXT_ARG = "grpc_context"  # Ray Serve's keyword for the context
INTERNAL = 13


class GrpcMethods:
    """The servicers' methods this replica has been asked for, imported once each."""

    def __init__(self) -> None:
        self._by_servicer: dict[str, dict[str, GrpcMethod]] = {}
        self._takes_context: dict[str, bool] = {}

    def __repr__(self) -> str:
        return f"<GrpcMethods servicers={len(self._by_servicer)}>"

    def method(self, servicer: str, path: str) -> GrpcMethod:
        methods = self._by_servicer.get(servicer)
        if methods is None:
            methods = self._by_servicer[servicer] = methods_of(servicer)
        method = methods.get(path)
        if method is None:
            raise ConfigError(f"{servicer} declares no method {path}")
        return method

    def takes_context(self, name: str, function: Callable[..., Any]) -> bool:
        known = self._takes_context.get(name)
        if known is None:
            try:
                known = GRPC_CONTEXT_ARG in inspect.signature(function).parameters
            except (TypeError, ValueError):
                known = False
            self._takes_context[name] = known
        return known


def _serialize(method: GrpcMethod, value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    serializer = method.response_serializer
    if serializer is not None:
        return serializer(value)
    return bytes(value.SerializeToString())


async def serve_call(message: GrpcRequest, user: Any, methods: GrpcMethods, context: Any,
                     stream: Any, send: Callable[[Message], None],
                     send_stream: Callable[[Item, int], Awaitable[None]]) -> bool:
    """Serve `message`; False when the user's code failed. `stream` is its client
    stream (a gRPCInputStream), if it has one."""
    rid = message.id
    try:
        method = methods.method(message.servicer, message.method)
        if stream is not None:
            stream._deserialize = method.request_deserializer
            stream.start()
            argument: Any = stream
        elif method.request_deserializer is not None:
            argument = method.request_deserializer(message.body)
        else:
            argument = message.body
        name = method.name
        function = user.method(name)
        kwargs = {GRPC_CONTEXT_ARG: context} if methods.takes_context(name, function) else {}
        result = await user.call(name, (argument,), kwargs)
        if method.response_streaming:
            async for item in user.iterate(result):
                payload = _serialize(method, item)
                await send_stream(Item(id=rid, payload=payload), len(payload))
            code, details = context.status()
            send(GrpcEnd(rid, code, details, pack_metadata(context.trailing_metadata())))
        else:
            body = _serialize(method, result)
            code, details = context.status()
            send(GrpcEnd(rid, code, details, pack_metadata(context.trailing_metadata()), body,
                         True))
    except asyncio.CancelledError:
        send(Failure(id=rid, kind="cancelled", message="request cancelled"))
    except Exception as exc:
        code, details = context.status()
        if code == 0:
            log.exception("gRPC %s raised", message.method)
            code = INTERNAL
        send(GrpcEnd(rid, code, details or str(exc) or type(exc).__name__,
                     pack_metadata(context.trailing_metadata())))
        return False
    return True


def pull_sender(rid: int, send: Callable[[Message], None]) -> Callable[[int], None]:
    def pull(count: int) -> None:
        send(Pull(id=rid, count=count))
    return pull
