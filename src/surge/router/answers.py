"""What a handle call's answer frames become for its caller.

A unary call's `Result` or `Failure` lands in a future (an asyncio one on the runtime's
loop, a concurrent one for a caller on another thread); a streamed call's `Item`s wait
in a queue for its generator, `END` after the last. A `Failure` becomes the exception
it carried (pickled by the replica), else one of surge's errors by its kind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import pickle
from typing import Any

from surge.errors import (
    DeploymentUnavailableError,
    RayServeException,
    RequestCancelledError,
    UserCodeError,
)
from surge.router.replica_link import Pending
from surge.transport.messages import End, Failure, Item, Message, Result

__all__ = ["END", "AnyFuture", "StreamSink", "UnarySink", "decode_failure"]

END = object()  # a stream's end, as StreamSink.next returns it

AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


def decode_failure(message: Failure) -> BaseException:
    if message.payload:
        try:
            exc = pickle.loads(message.payload)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    if message.kind == "cancelled":
        return RequestCancelledError(message.message)
    if message.kind == "unavailable":
        return DeploymentUnavailableError(message.message)
    if message.kind == "user":
        return UserCodeError(message.message)
    return RayServeException(message.message)


class UnarySink:
    """Delivers one result into an asyncio future or (from another thread) a concurrent one."""

    __slots__ = ("future",)

    def __init__(self, future: AnyFuture) -> None:
        self.future = future

    def deliver(self, message: Message) -> None:
        if isinstance(message, Result):
            try:
                value = pickle.loads(message.payload)
            except Exception as exc:
                self.fail(exc)
                return
            if not self.future.done():
                with contextlib.suppress(asyncio.InvalidStateError,
                                         concurrent.futures.InvalidStateError):
                    self.future.set_result(value)
        elif isinstance(message, Failure):
            self.fail(decode_failure(message))
        else:
            self.fail(RayServeException(
                f"expected a result, got {type(message).__name__}; call a generator method "
                "with handle.options(stream=True)"))

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            with contextlib.suppress(asyncio.InvalidStateError,
                                     concurrent.futures.InvalidStateError):
                self.future.set_exception(exc)


class StreamSink:
    """A stream's items as they come. The queue holds at most a flow-control window of
    them (transport/flow.py): each item is reported consumed once the caller takes it."""

    __slots__ = ("pending", "queue")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.pending: Pending | None = None

    def deliver(self, message: Message) -> None:
        if isinstance(message, Item):
            self.queue.put_nowait(_Item(pickle.loads(message.payload), len(message.payload)))
        elif isinstance(message, End):
            self.queue.put_nowait(END)
        elif isinstance(message, Failure):
            self.queue.put_nowait(decode_failure(message))
        elif isinstance(message, Result):  # a plain method called with stream=True
            self.queue.put_nowait(_Item(pickle.loads(message.payload), 0))
            self.queue.put_nowait(END)

    def fail(self, exc: BaseException) -> None:
        self.queue.put_nowait(exc)

    async def next(self) -> Any:
        """The next value, END, or an exception (returned, not raised)."""
        item = await self.queue.get()
        if isinstance(item, _Item):
            if self.pending is not None:
                self.pending.consumed(item.size)
            return item.value
        return item


class _Item:
    __slots__ = ("size", "value")

    def __init__(self, value: Any, size: int) -> None:
        self.value, self.size = value, size
