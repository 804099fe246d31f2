"""One caller's share of a streaming `@serve.batch` batch: its elements, in order.

An async generator batch yields lists, one element per caller; each caller's go into
its own `CallerStream`, which its wrapper iterates (`StopIteration` as an element ends
that caller's stream). A stream holds at most `STREAM_AHEAD_ITEMS` elements: the batch
waits (on its `room` event) while any listening caller's is full. A caller that goes
away leaves its stream, which then takes nothing more.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

__all__ = ["STREAM_AHEAD_ITEMS", "CallerStream"]

STREAM_AHEAD_ITEMS = 16  # per caller: rides out a slow reader's hiccup, bounds its memory


def _ends_stream(item: Any) -> bool:
    return (item is StopIteration or item is StopAsyncIteration
            or isinstance(item, StopIteration | StopAsyncIteration))


class CallerStream:
    """One caller's share of a streaming batch: its elements, in order, until it ends."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.ended = False
        self.error: BaseException | None = None
        self.gone = False  # the caller went away
        self.readable = asyncio.Event()
        self.room: asyncio.Event | None = None  # the batch's: set when this stream drains

    @property
    def open(self) -> bool:
        """Whether the batch still sends to it."""
        return not (self.ended or self.gone)

    def full(self) -> bool:
        return self.open and len(self.items) >= STREAM_AHEAD_ITEMS

    def put(self, item: Any) -> None:
        if not self.open:
            return
        if _ends_stream(item):
            self.finish(None)
        else:
            self.items.append(item)
            self.readable.set()

    def finish(self, error: BaseException | None) -> None:
        """End the stream after what it holds: normally, or raising `error`."""
        if self.open:
            self.ended, self.error = True, error
            self.readable.set()

    def leave(self) -> None:
        self.gone = True
        self.items.clear()
        self._drained()

    # An async iterator, not a getter returning an end marker: the wrapper that reads it
    # travels by value with a class defined in a function (functools.wraps gives it the
    # user's qualname), and a marker in its globals would be a copy, never the end.
    def __aiter__(self) -> CallerStream:
        return self

    async def __anext__(self) -> Any:
        while not self.items and not self.ended:
            self.readable.clear()
            await self.readable.wait()
        if self.items:
            item = self.items.popleft()
            self._drained()
            return item
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration

    def _drained(self) -> None:
        if self.room is not None:
            self.room.set()
