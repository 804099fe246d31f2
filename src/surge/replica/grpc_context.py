"""What a deployment's gRPC method sees: Ray Serve's `RayServegRPCContext` (passed as
`grpc_context=` when the method takes it) and `gRPCInputStream` (a client stream).

The context is a plain, picklable record of the call (its metadata, peer, request id)
plus what the method sets on it (code, details, trailing metadata, compression); the
replica sends the code, details and trailers back with the call's end, so they reach the
client as if the method ran in the proxy. A code is stored as grpc's `StatusCode` the
user gave, and travels as its number.

A client stream arrives as the replica asks for it: `STREAM_WINDOW` messages at first,
then more each time the method has taken half of them, so a slow method holds at most a
window of the client's messages (the proxy reads no further; grpc's own flow control
then holds the client).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["STREAM_WINDOW", "RayServegRPCContext", "code_number", "gRPCInputStream"]

# Client-stream messages the replica may hold before its method takes them.
STREAM_WINDOW = 16

Metadata = list[tuple[str, str | bytes]]


def code_number(code: Any) -> int:
    """grpc.StatusCode (its value is (number, name)), or a plain number, as a number."""
    value = getattr(code, "value", code)
    if isinstance(value, tuple):
        value = value[0]
    return int(value)


class RayServegRPCContext:
    """Ray Serve's picklable stand-in for grpc's ServicerContext, with its methods."""

    def __init__(self, invocation_metadata: Metadata | None = None, peer: str = "") -> None:
        self._invocation_metadata = list(invocation_metadata or ())
        self._metadata = {key: value for key, value in self._invocation_metadata}
        self._peer = peer
        self._code: Any = None
        self._details = ""
        self._trailing_metadata: Metadata = []
        self._compression: Any = None

    def __repr__(self) -> str:
        return (f"<RayServegRPCContext code={self._code!r} details={self._details!r} "
                f"trailers={len(self._trailing_metadata)}>")

    def auth_context(self) -> dict[str, Any]:
        return {}

    def code(self) -> Any:
        return self._code

    def details(self) -> str:
        return self._details

    def _value(self, key: str) -> str | None:
        value = self._metadata.get(key)
        return value if isinstance(value, str) else None

    def request_id(self) -> str | None:
        return self._value("request_id")

    def application(self) -> str | None:
        return self._value("application")

    def multiplexed_model_id(self) -> str | None:
        return self._value("multiplexed_model_id")

    def traceparent(self) -> str | None:
        return self._value("traceparent")

    def tracestate(self) -> str | None:
        return self._value("tracestate")

    def invocation_metadata(self) -> Metadata:
        return self._invocation_metadata

    def peer(self) -> str:
        return self._peer

    def peer_identities(self) -> bytes | None:
        return None

    def peer_identity_key(self) -> str | None:
        return None

    def trailing_metadata(self) -> Metadata:
        return self._trailing_metadata

    def set_code(self, code: Any) -> None:
        self._code = code

    def set_compression(self, compression: Any) -> None:
        self._compression = compression

    def set_details(self, details: str) -> None:
        self._details = details

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self._trailing_metadata = [(str(k), v) for k, v in trailing_metadata]

    def status(self) -> tuple[int, str]:
        """The code (0 when unset) and details to send back."""
        return (0 if self._code is None else code_number(self._code)), self._details or ""


class gRPCInputStream:
    """The messages of a client stream, parsed as the method takes them."""

    def __init__(self, deserializer: Callable[[bytes], Any] | None,
                 pull: Callable[[int], None], window: int = STREAM_WINDOW) -> None:
        self._deserialize = deserializer
        self._pull = pull
        self._window = window
        self._queue: deque[bytes] = deque()
        self._ended = False
        self._cancelled = False
        self._exhausted = False
        self._taken = 0  # messages taken since the last pull
        self._waiter: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return (f"<gRPCInputStream queued={len(self._queue)} ended={self._ended} "
                f"cancelled={self._cancelled}>")

    def start(self) -> None:
        self._pull(self._window)

    def feed(self, body: bytes, more: bool) -> None:
        if more:
            self._queue.append(body)
        else:
            self._ended = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> gRPCInputStream:
        return self

    async def __anext__(self) -> Any:
        while not self._queue:
            if self._ended or self._cancelled:
                self._exhausted = True
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        body = self._queue.popleft()
        self._taken += 1
        if self._taken * 2 >= self._window and not self._ended:
            self._pull(self._taken)
            self._taken = 0
        return body if self._deserialize is None else self._deserialize(body)

    def is_cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        self._cancelled = True
        self._wake()

    @property
    def is_exhausted(self) -> bool:
        return self._exhausted
